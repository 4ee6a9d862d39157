"""Optimizer configuration and OptState save/restore."""

from __future__ import annotations

import numpy as np
import pytest

from nn.optim import Optimizer, OptState
from nn.spec import ModelSpec
from nn.train import train_steps


def test_unknown_kind_is_named() -> None:
    with pytest.raises(ValueError, match="'rmsprop'"):
        Optimizer(kind="rmsprop")


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"lr": 0.0}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"momentum": 1.0}, "momentum"),
        ({"beta2": -0.1}, "beta2"),
        ({"eps": 0.0}, "eps"),
        ({"lr": "fast"}, "lr"),
    ],
)
def test_bad_hyperparameters_are_named(kw: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Optimizer(**kw)


def test_dict_round_trip_and_unknown_field() -> None:
    opt = Optimizer(kind="momentum", lr=0.01, nesterov=True)
    assert Optimizer.from_dict(opt.to_dict()) == opt
    with pytest.raises(ValueError, match="'lrate'"):
        Optimizer.from_dict({"lrate": 0.1})


@pytest.mark.parametrize(
    ("kind", "names"), [("sgd", set()), ("momentum", {"velocity"}), ("adam", {"m", "v"})]
)
def test_init_buffers(kind: str, names: set[str]) -> None:
    spec = ModelSpec.preset("small")
    state = OptState.init(Optimizer(kind=kind), spec)
    assert set(state.buffers) == names
    assert all(
        b.shape == (spec.num_params,) and b.dtype == np.float32 for b in state.buffers.values()
    )


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adam"])
def test_save_and_restore_continues_identically(kind: str) -> None:
    spec = ModelSpec(widths=(8, 16, 3))
    rng = np.random.default_rng(0)
    X = rng.standard_normal((64, 8)).astype(np.float32)
    y = rng.integers(0, 3, 64)
    params = spec.init_params(0)
    state = OptState.init(Optimizer(kind=kind, lr=0.01), spec)
    train_steps(params, state, X, y, 10, 8, np.random.default_rng(1))
    saved_params, saved = params.copy(), state.state_dict()
    train_steps(params, state, X, y, 10, 8, np.random.default_rng(2))

    restored = OptState.from_state_dict(saved, spec)
    assert restored.step == 10
    train_steps(saved_params, restored, X, y, 10, 8, np.random.default_rng(2))
    assert saved_params.array_equal(params)
    for name, buf in state.buffers.items():
        assert restored.buffers[name].tobytes() == buf.tobytes()


def test_state_dict_is_a_copy() -> None:
    spec = ModelSpec(widths=(4, 3))
    state = OptState.init(Optimizer(kind="adam"), spec)
    d = state.state_dict()
    d["buffer.m"][0] = 1.0
    assert state.buffers["m"][0] == 0.0


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d.pop("step"), "'step'"),
        (lambda d: d.pop("buffer.v"), "buffers"),
        (lambda d: d.update({"buffer.v": np.zeros(3, np.float32)}), "shape"),
        (lambda d: d.update({"buffer.v": np.zeros(15, np.float64)}), "float32"),
        (lambda d: d.update({"extra": 1}), "'extra'"),
        (lambda d: d.update({"step": -1}), "step"),
    ],
)
def test_from_state_dict_rejects_mismatch(mutate, match: str) -> None:
    spec = ModelSpec(widths=(4, 3))  # 15 parameters
    d = OptState.init(Optimizer(kind="adam"), spec).state_dict()
    mutate(d)
    with pytest.raises(ValueError, match=match):
        OptState.from_state_dict(d, spec)


def test_kinds_agree_with_kernel_codes_and_nn_import_stays_light() -> None:
    import subprocess
    import sys

    from nn import kernels, optim

    assert optim.OPT_CODES == kernels.OPT_CODES
    code = "import sys, nn; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
