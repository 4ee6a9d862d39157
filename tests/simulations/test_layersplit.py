"""simulations.layersplit: the relay's frames, the bytes counted, the numerics carried."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nn import layersplit as ls
from nn.data import load_digits
from nn.optim import Optimizer
from nn.spec import ModelSpec
from nn.train import evaluate
from protocol import messages as m
from protocol.chunking import chunk_named
from protocol.errors import ErrorCode
from protocol.limits import PROFILES, LinkLimits
from protocol.reassembly import Reassembler
from simulations.layersplit import (
    DIRECTIONS,
    Forward,
    Refuse,
    Relay,
    Role,
    SplitConfig,
    per_epoch,
    simulate,
)

SPEC = ModelSpec(widths=(64, 32, 32, 10))
SGD = Optimizer(kind="sgd", lr=0.2)
ROBLOX = PROFILES["roblox"]
SMALL = LinkLimits(bytes_per_s=20_000, messages_per_s=10, max_message_bytes=4096)


def _digits(n: int = 400):
    ds = load_digits()
    return ds.X_train[:n], ds.y_train[:n]


def _frames(arrays, transfer: str, limits: LinkLimits = ROBLOX) -> list[bytes]:
    chunks = chunk_named(
        arrays,
        max_message_bytes=limits.max_message_bytes,
        transfer=transfer,
        target_bytes=limits.frame_bytes,
        spans=True,
    )
    return [m.encode(c) for c in chunks]


def _slice(rows: int = 96, width: int = 32, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "h": rng.random((rows, width), dtype=np.float32),
        "y": rng.integers(0, 10, rows).astype(np.float32),
    }


def test_relay_forwards_frames_that_decode_to_the_same_arrays() -> None:
    arrays = _slice(rows=300)
    relay = Relay(first=SMALL, second=SMALL)
    shapes = {k: a.shape for k, a in arrays.items()}
    relay.expect("t/0", shapes)
    frames = _frames(arrays, "t/0", SMALL)
    assert len(frames) > 5 and all(len(f) <= SMALL.max_message_bytes for f in frames)
    second = Reassembler.for_named(shapes, transfer="t/0")
    for f in frames:
        (fwd,) = relay.receive(Role.FIRST, f)
        assert fwd == Forward(to=Role.SECOND, frame=f)
        second.add(m.decode(fwd.frame))
    got = second.arrays()
    np.testing.assert_array_equal(got[(0, "h")], arrays["h"])
    np.testing.assert_array_equal(got[(1, "y")], arrays["y"])
    ack = m.encode(m.Ack(task_id="t/0", accepted=True))
    assert relay.receive(Role.SECOND, ack) == [Forward(to=Role.FIRST, frame=ack)]
    # acked once: a second ack for it is refused
    (again,) = relay.receive(Role.SECOND, ack)
    assert isinstance(again, Refuse) and again.code is ErrorCode.UNKNOWN_TASK


def _refusal(relay: Relay, sender: Role, frame: bytes) -> Refuse:
    (out,) = relay.receive(sender, frame)
    assert isinstance(out, Refuse) and out.who is sender
    return out


def test_relay_refuses_what_does_not_fit() -> None:
    arrays = _slice()
    shapes = {k: a.shape for k, a in arrays.items()}
    relay = Relay(first=SMALL, second=SMALL)
    relay.expect("t/1", shapes)
    frames = _frames(arrays, "t/1", SMALL)
    assert len(frames) > 2
    stray = _frames(arrays, "t/other", SMALL)[0]
    assert _refusal(relay, Role.FIRST, stray).code is ErrorCode.UNKNOWN_TASK
    relay.receive(Role.FIRST, frames[0])
    assert _refusal(relay, Role.FIRST, frames[0]).code is ErrorCode.DUPLICATE
    # an ack before the transfer completed
    early = m.encode(m.Ack(task_id="t/1", accepted=True))
    assert _refusal(relay, Role.SECOND, early).code is ErrorCode.UNKNOWN_TASK
    assert _refusal(relay, Role.SECOND, frames[1]).code is ErrorCode.UNEXPECTED
    assert _refusal(relay, Role.FIRST, b"\xc1garbage").code is ErrorCode.MALFORMED
    # a refused frame changed nothing: the rest completes the transfer
    for f in frames[1:]:
        assert isinstance(relay.receive(Role.FIRST, f)[0], Forward)
    assert isinstance(relay.receive(Role.SECOND, early)[0], Forward)
    tight = Relay(first=ROBLOX, second=SMALL)
    tight.expect("t/2", shapes)
    big = _frames(arrays, "t/2")[0]
    assert _refusal(tight, Role.FIRST, big).code is ErrorCode.TOO_LARGE


def _config(**kw) -> SplitConfig:
    base = {"epochs": 2, "batch": 16, "slice_batches": 3}
    return SplitConfig(**(base | kw))


def test_fp32_frames_carry_the_reference_numerics_bit_for_bit() -> None:
    X, y = _digits()
    cfg = _config()
    res = simulate(SPEC, 1, X, y, config=cfg, optimizer=SGD, seed=4)
    ref = ls.train_split(SPEC, (1,), X, y, epochs=2, batch=16, optimizer=SGD, seed=4)
    for got, want in zip(res.blocks, ref, strict=True):
        assert got.params.array_equal(want.params)
    assert res.params.array_equal(ls.joined(SPEC, ref))


@settings(max_examples=8, deadline=None)
@given(slice_batches=st.integers(1, 7), window=st.integers(1, 4), latency=st.sampled_from([0, 0.1]))
def test_numerics_do_not_depend_on_slicing_or_pacing(
    slice_batches: int, window: int, latency: float
) -> None:
    X, y = _digits(200)
    base = simulate(SPEC, 2, X, y, config=_config(epochs=1), optimizer=SGD, seed=1)
    cfg = _config(epochs=1, slice_batches=slice_batches, window=window, latency_s=latency)
    res = simulate(SPEC, 2, X, y, config=cfg, optimizer=SGD, seed=1)
    assert res.params.array_equal(base.params)
    slices = math.ceil(len(ls.batch_sizes(200, 16)) / slice_batches)
    assert res.epochs[0].traffic["second_up"].frames == slices


def test_bytes_and_frames_are_counted_per_direction() -> None:
    X, y = _digits()
    res = simulate(SPEC, 1, X, y, config=_config(epochs=3), optimizer=SGD, seed=0)
    rows = sum(ls.batch_sizes(len(X), 16))  # 400 rows: 25 full batches
    slices = math.ceil(25 / 3)
    payload = rows * 32 * 4 + rows * 4  # boundary fp32 and the labels
    for e in res.epochs:
        up, down = e.traffic["first_up"], e.traffic["second_down"]
        assert up == down  # the relay forwards frames unchanged
        assert up.frames == slices  # 3 batches of 16 x 32 floats fit one roblox frame
        assert payload < up.bytes < payload + 200 * up.frames  # envelope: tens of bytes
        assert e.traffic["second_up"].frames == e.traffic["first_down"].frames == slices
        assert e.traffic["second_up"].bytes < 60 * slices
    mean = per_epoch(res)
    assert set(mean) == set(DIRECTIONS)
    assert mean["first_up"]["bytes"] == res.epochs[0].traffic["first_up"].bytes
    assert res.collect_bytes > SPEC.nbytes


def test_time_follows_the_link() -> None:
    X, y = _digits()
    slow = simulate(SPEC, 1, X, y, config=_config(), optimizer=SGD, seed=0)
    ends = [e.end_s for e in slow.epochs]
    assert ends == sorted(ends)
    epoch_bytes = slow.epochs[1].traffic["first_up"].bytes
    # link-bound on roblox: at least the bytes at the rate, not much more
    wire = epoch_bytes / ROBLOX.bytes_per_s
    assert wire <= ends[1] - ends[0] < 1.5 * wire
    fast = simulate(
        SPEC, 1, X, y, config=_config(link=PROFILES["unlimited"]), optimizer=SGD, seed=0
    )
    assert fast.seconds < slow.seconds / 10
    assert fast.params.array_equal(slow.params)
    lagged = simulate(SPEC, 1, X, y, config=_config(latency_s=0.5, window=1), optimizer=SGD, seed=0)
    # window 1: each of the 2 x 9 slices waits for its ack, four one-way latencies
    assert lagged.seconds >= 2 * 9 * 4 * 0.5


def test_fp16_halves_the_bytes_and_still_learns() -> None:
    X, y = _digits(800)
    ds = load_digits()
    cfg = _config(epochs=6)
    a = simulate(SPEC, 1, X, y, config=cfg, optimizer=SGD, seed=2)
    b = simulate(SPEC, 1, X, y, config=replace(cfg, codec="fp16"), optimizer=SGD, seed=2)
    ratio = per_epoch(b)["first_up"]["bytes"] / per_epoch(a)["first_up"]["bytes"]
    assert 0.49 < ratio < 0.53
    assert not b.params.array_equal(a.params)
    acc = [evaluate(r.params, ds.X_test, ds.y_test).accuracy for r in (a, b)]
    assert acc[0] > 0.85 and abs(acc[0] - acc[1]) < 0.03


def test_same_seed_same_run() -> None:
    X, y = _digits(200)
    runs = [simulate(SPEC, 1, X, y, config=_config(), optimizer=SGD, seed=9) for _ in range(2)]
    assert runs[0].params.array_equal(runs[1].params)
    assert runs[0].epochs == runs[1].epochs


@pytest.mark.parametrize("bad", [{"epochs": 0}, {"slice_batches": 0}, {"window": 0}])
def test_config_is_checked(bad: dict) -> None:
    with pytest.raises(ValueError, match="layer split"):
        _config(**bad)


def test_a_split_job_on_the_real_core_reaches_its_target_under_churn() -> None:
    """The ``layer-split-digits`` scenario: 8 roblox players, a fifth leaving a
    minute, train the two blocks through the real core and client sessions
    (coordinator/core/layersplit.py); none is closed for anything it did, and a seed
    gives the same run."""
    from simulations.driver import Simulation
    from simulations.scenario import load_raw, parse_scenario, resolve

    def run() -> dict:
        data = load_raw(resolve("layer-split-digits"))
        return Simulation(parse_scenario(data, source="layer-split-digits")).run().summary

    s = run()
    assert s["reason"] == "target_accuracy", s
    assert s["drops"] > 0 and s["honest_closes"] == 0
    assert run() == s
