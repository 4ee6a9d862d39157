"""train_steps, compute_gradient, evaluate, predict: oracle, determinism, bad input."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from nn import reference as ref
from nn.data import load_digits
from nn.optim import Optimizer, OptState
from nn.params import Params
from nn.spec import ModelSpec
from nn.train import (
    batch_indices,
    compute_gradient,
    evaluate,
    fit,
    group_threads,
    layout_of,
    predict,
    train_steps,
)

OPTIMIZERS = [
    Optimizer(kind="sgd", lr=0.05),
    Optimizer(kind="momentum", lr=0.05, momentum=0.9),
    Optimizer(kind="momentum", lr=0.05, momentum=0.9, nesterov=True),
    Optimizer(kind="adam", lr=0.003),
]


def _data(spec: ModelSpec, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, spec.widths[0])).astype(np.float32)
    if spec.loss == "mse":
        return X, rng.standard_normal((n, spec.widths[-1])).astype(np.float32)
    return X, rng.integers(0, spec.widths[-1], n).astype(np.int32)


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: f"{o.kind}{'-nesterov' * o.nesterov}")
@pytest.mark.parametrize("widths", [(5, 5, 5, 5, 3), (20, 64, 48, 5)], ids=["loops", "blas"])
@pytest.mark.parametrize("loss", ["mse", "softmax_ce"])
def test_train_steps_match_reference(opt: Optimizer, widths, loss: str) -> None:
    spec = ModelSpec(
        widths=widths, loss=loss, activations=("tanh",) * (len(widths) - 2) + ("identity",)
    )
    X, y = _data(spec, 100)
    params = spec.init_params(1)
    Ws = [W.astype(np.float64) for W in params.W]
    bs = [b.astype(np.float64) for b in params.b]
    state = OptState.init(opt, spec)
    steps, batch = 20, 16
    metrics = train_steps(params, state, X, y, steps, batch, np.random.default_rng(5))
    idx = batch_indices(len(X), steps, batch, np.random.default_rng(5))
    ropt = ref.RefOptimizer(opt.kind, opt.lr, opt.momentum, opt.nesterov, opt.beta1, opt.beta2)
    losses = ref.train(Ws, bs, spec.activations, loss, X.astype(np.float64), y, idx, batch, ropt)
    want = Params.from_layers(spec, list(zip(Ws, bs, strict=True))).data.astype(np.float64)
    got = params.data.astype(np.float64)
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))
    assert metrics.loss == pytest.approx(np.mean(losses), rel=1e-5)
    assert metrics.last_loss == pytest.approx(losses[-1], rel=1e-5)
    assert (metrics.steps, metrics.samples, state.step) == (steps, steps * batch, steps)


def test_compute_gradient_matches_reference() -> None:
    spec = ModelSpec(widths=(20, 64, 10))
    X, y = _data(spec, 50)
    params = spec.init_params(2)
    value, grad = compute_gradient(params, X, y)
    Ws = [W.astype(np.float64) for W in params.W]
    bs = [b.astype(np.float64) for b in params.b]
    rvalue, dWs, dbs = ref.loss_and_grad(Ws, bs, spec.activations, "softmax_ce", X, y)
    want = Params.from_layers(spec, list(zip(dWs, dbs, strict=True))).data.astype(np.float64)
    assert value == pytest.approx(rvalue, rel=1e-5)
    assert np.max(np.abs(grad.data - want)) <= 1e-5 * np.max(np.abs(want))


def test_digits_reaches_95_percent_within_budget() -> None:
    ds = load_digits()
    spec = ModelSpec(widths=(64, 128, 10))
    params = spec.init_params(0)
    state = OptState.init(Optimizer(kind="sgd", lr=0.2), spec)
    before = evaluate(params, ds.X_test, ds.y_test)
    train_steps(params, state, ds.X_train, ds.y_train, 1000, 32, np.random.default_rng(0))
    after = evaluate(params, ds.X_test, ds.y_test)
    assert before.accuracy < 0.5
    assert after.accuracy >= 0.95
    assert after.n == len(ds.y_test)


def _run_100(seed: int) -> Params:
    spec = ModelSpec(widths=(20, 64, 48, 5))
    X, y = _data(spec, 300)
    params = spec.init_params(seed)
    state = OptState.init(Optimizer(kind="adam", lr=0.01), spec)
    train_steps(params, state, X, y, 100, 16, np.random.default_rng(seed))
    return params


def test_same_seed_single_thread_is_bitwise_equal() -> None:
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            a, b, c = _run_100(7), _run_100(7), _run_100(8)
    finally:
        numba.set_num_threads(before)
    assert a.array_equal(b)
    assert not a.array_equal(c)


# 16 rows x 512 x 512 reaches kernels.PAR_MIN_MACS: the hidden layers run as neuron groups.
GROUPED = (20, 512, 512, 5)


def _with_numba_threads(n: int, fn):
    before = numba.get_num_threads()
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    try:
        return fn()
    finally:
        numba.set_num_threads(before)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 numba threads")
@pytest.mark.parametrize(
    # Adam moves a weight by about lr * g / (|g| + eps): where g is float32 rounding
    # noise near zero, float32 and the float64 reference part by up to lr (seen on
    # an AMD EPYC: 1.4e-5 of the largest weight after 8 steps). eps = 1e-4 keeps
    # that at rounding size; the grouped m and v bookkeeping under test is the same.
    "opt",
    [OPTIMIZERS[0], Optimizer(kind="adam", lr=0.003, eps=1e-4)],
    ids=lambda o: o.kind,
)
def test_neuron_groups_on_two_threads_match_reference(opt: Optimizer) -> None:
    spec = ModelSpec(widths=GROUPED, loss="mse")
    assert _with_numba_threads(2, lambda: group_threads(layout_of(spec), 16)) == 2
    X, y = _data(spec, 64)
    params = spec.init_params(1)
    Ws = [W.astype(np.float64) for W in params.W]
    bs = [b.astype(np.float64) for b in params.b]
    steps, batch = 8, 16
    state = OptState.init(opt, spec)
    _with_numba_threads(
        2, lambda: train_steps(params, state, X, y, steps, batch, np.random.default_rng(5))
    )
    idx = batch_indices(len(X), steps, batch, np.random.default_rng(5))
    ropt = ref.RefOptimizer(
        opt.kind, opt.lr, opt.momentum, opt.nesterov, opt.beta1, opt.beta2, opt.eps
    )
    ref.train(Ws, bs, spec.activations, "mse", X.astype(np.float64), y, idx, batch, ropt)
    want = Params.from_layers(spec, list(zip(Ws, bs, strict=True))).data.astype(np.float64)
    assert np.max(np.abs(params.data - want)) <= 1e-5 * np.max(np.abs(want))


def test_group_threads_is_one_for_small_models_or_one_thread() -> None:
    big = layout_of(ModelSpec(widths=GROUPED))
    assert _with_numba_threads(1, lambda: group_threads(big, 16)) == 1
    assert _with_numba_threads(2, lambda: group_threads(big, 4)) == 1  # too few MACs
    small = layout_of(ModelSpec(widths=(20, 64, 48, 5)))
    assert _with_numba_threads(2, lambda: group_threads(small, 128)) == 1


def test_whole_layers_on_two_blas_threads_match_reference() -> None:
    # One numba thread: no neuron groups, BLAS splits each whole layer itself.
    spec = ModelSpec(widths=GROUPED, loss="mse")
    X, y = _data(spec, 128)
    params = spec.init_params(2)
    Ws = [W.astype(np.float64) for W in params.W]
    bs = [b.astype(np.float64) for b in params.b]
    steps, batch = 3, 64
    opt = Optimizer(kind="sgd", lr=0.05)
    state = OptState.init(opt, spec)
    with threadpool_limits(limits=2):
        _with_numba_threads(
            1, lambda: train_steps(params, state, X, y, steps, batch, np.random.default_rng(9))
        )
    idx = batch_indices(len(X), steps, batch, np.random.default_rng(9))
    ref.train(Ws, bs, spec.activations, "mse", X.astype(np.float64), y, idx, batch,
              ref.RefOptimizer("sgd", opt.lr))  # fmt: skip
    want = Params.from_layers(spec, list(zip(Ws, bs, strict=True))).data.astype(np.float64)
    assert np.max(np.abs(params.data - want)) <= 1e-5 * np.max(np.abs(want))


def test_neuron_groups_are_bitwise_reproducible() -> None:
    spec = ModelSpec(widths=GROUPED, loss="mse")
    X, y = _data(spec, 64)

    def run() -> Params:
        params = spec.init_params(3)
        state = OptState.init(Optimizer(kind="sgd", lr=0.01), spec)
        train_steps(params, state, X, y, 6, 16, np.random.default_rng(1))
        return params

    a, b = _with_numba_threads(2, run), _with_numba_threads(2, run)
    assert a.array_equal(b)


def test_predict_gives_probabilities_for_softmax_ce() -> None:
    spec = ModelSpec(widths=(20, 16, 4))
    X, _ = _data(spec, 30)
    probs = predict(spec.init_params(0), X)
    assert probs.shape == (30, 4)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-6)
    assert (probs >= 0).all()


def test_mse_accepts_int_labels_as_one_hot() -> None:
    spec = ModelSpec(widths=(6, 8, 3), loss="mse")
    rng = np.random.default_rng(0)
    X = rng.standard_normal((12, 6)).astype(np.float32)
    labels = rng.integers(0, 3, 12)
    params = spec.init_params(0)
    a = evaluate(params, X, labels)
    b = evaluate(params, X, np.eye(3, dtype=np.float32)[labels])
    assert a == b
    la, _ = compute_gradient(params, X, labels)
    lb, _ = compute_gradient(params, X, np.eye(3, dtype=np.float32)[labels])
    assert la == lb


def test_zero_steps_leaves_params_alone() -> None:
    spec = ModelSpec(widths=(20, 16, 4))
    X, y = _data(spec, 30)
    params = spec.init_params(0)
    before = params.copy()
    m = train_steps(params, OptState.init(Optimizer(), spec), X, y, 0, 8, np.random.default_rng(0))
    assert m.steps == 0 and np.isnan(m.loss)
    assert params.array_equal(before)


def _bad(spec, X, y, **kw):
    args = {"steps": 3, "batch": 4, **kw}
    state = OptState.init(Optimizer(), spec)
    return train_steps(
        spec.init_params(0), state, X, y, args["steps"], args["batch"], np.random.default_rng(0)
    )


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("wrong_features", "5 features"),
        ("one_d_X", "2-D"),
        ("nan_X", "NaN or inf"),
        ("inf_y", "NaN or inf"),
        ("rows_mismatch", "rows"),
        ("label_range", r"labels must be in \[0, 4\)"),
        ("float_labels_ce", "integer class labels"),
        ("empty_X", "empty"),
        ("empty_batch", "empty batch"),
        ("negative_steps", "steps"),
    ],
)
def test_bad_input_raises_value_error_naming_it(case: str, match: str) -> None:
    spec = ModelSpec(widths=(6, 8, 4))
    mse = ModelSpec(widths=(6, 8, 4), loss="mse")
    X, y = _data(spec, 10)
    Xm, ym = _data(mse, 10)
    with pytest.raises(ValueError, match=match):
        match case:
            case "wrong_features":
                _bad(spec, X[:, :5], y)
            case "one_d_X":
                _bad(spec, X[:, 0], y)
            case "nan_X":
                X[3, 2] = np.nan
                _bad(spec, X, y)
            case "inf_y":
                ym[1, 1] = np.inf
                _bad(mse, Xm, ym)
            case "rows_mismatch":
                _bad(spec, X, y[:9])
            case "label_range":
                y[0] = 4
                _bad(spec, X, y)
            case "float_labels_ce":
                _bad(spec, X, y.astype(np.float32))
            case "empty_X":
                _bad(spec, X[:0], y[:0])
            case "empty_batch":
                _bad(spec, X, y, batch=0)
            case "negative_steps":
                _bad(spec, X, y, steps=-1)


def test_unknown_activation_is_named() -> None:
    with pytest.raises(ValueError, match="'gelu'"):
        ModelSpec(widths=(3, 4, 2), activations=("gelu", "identity"))


def test_bad_input_for_evaluate_and_predict() -> None:
    spec = ModelSpec(widths=(6, 8, 4))
    params = spec.init_params(0)
    X, y = _data(spec, 10)
    with pytest.raises(ValueError, match="6"):
        predict(params, np.zeros((3, 7), np.float32))
    X[0, 0] = np.inf
    with pytest.raises(ValueError, match="NaN or inf"):
        evaluate(params, X, y)


def test_fit_reports_each_chunk_and_equals_train_steps_on_whole_epochs() -> None:
    spec = ModelSpec(widths=(6, 8, 4))
    X, y = _data(spec, 64)
    a, b = spec.init_params(0), spec.init_params(0)
    seen: list[int] = []
    fit(
        a, OptState.init(Optimizer(), spec), X, y, 40, 16, np.random.default_rng(3),
        chunk=8, on_chunk=lambda done, m: seen.append(done),
    )  # fmt: skip
    assert seen == [8, 16, 24, 32, 40]
    # chunk of 4 steps x 16 rows = one epoch of 64 rows: same batches as one call
    c = spec.init_params(0)
    fit(c, OptState.init(Optimizer(), spec), X, y, 40, 16, np.random.default_rng(3), chunk=4)
    train_steps(b, OptState.init(Optimizer(), spec), X, y, 40, 16, np.random.default_rng(3))
    assert b.array_equal(c)
    with pytest.raises(ValueError, match="chunk"):
        fit(a, OptState.init(Optimizer(), spec), X, y, 4, 16, np.random.default_rng(3), chunk=0)
