import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.core.strategies.aggregate import (
    OuterOptimizer,
    schedule_factor,
    staleness_scale,
    weighted_mean,
)


def test_staleness_functions() -> None:
    assert staleness_scale(7, kind="constant") == 1.0
    assert staleness_scale(0, kind="polynomial", a=0.5) == 1.0
    assert staleness_scale(3, kind="polynomial", a=0.5) == pytest.approx(0.5)
    assert staleness_scale(4, kind="hinge", a=1.0, b=4) == 1.0
    assert staleness_scale(6, kind="hinge", a=1.0, b=4) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="staleness"):
        staleness_scale(-1, kind="constant")
    with pytest.raises(ValueError, match="unknown"):
        staleness_scale(1, kind="exp")


@given(st.integers(0, 1000), st.floats(0, 4), st.integers(0, 20))
def test_scales_are_in_unit_interval_and_non_increasing(s: int, a: float, b: int) -> None:
    for kind in ("constant", "polynomial", "hinge"):
        x, y = staleness_scale(s, kind=kind, a=a, b=b), staleness_scale(s + 1, kind=kind, a=a, b=b)
        assert 0 < y <= x <= 1


def test_warmup_cosine_schedule() -> None:
    ramp = {"kind": "warmup-cosine", "start": 1.0, "peak": 3.0, "end": 0.5}
    f = lambda v: schedule_factor(v, **ramp, warmup=10, versions=30)  # noqa: E731
    assert f(0) == 1.0 and f(5) == pytest.approx(2.0) and f(10) == pytest.approx(3.0)
    assert f(20) == pytest.approx(1.75)  # half-way down the cosine: the mean of peak and end
    assert f(30) == f(10_000) == 0.5
    # a ramp that holds: warmup = versions, end = peak
    hold = {"kind": "warmup-cosine", "start": 1.0, "peak": 2.0, "end": 2.0}
    assert [schedule_factor(v, **hold, warmup=4, versions=4) for v in (0, 2, 4, 99)] == [
        1.0,
        1.5,
        2.0,
        2.0,
    ]
    assert schedule_factor(123, kind="constant") == 1.0
    with pytest.raises(ValueError, match="version"):
        schedule_factor(-1, kind="constant")
    with pytest.raises(ValueError, match="unknown"):
        schedule_factor(1, kind="step")


@given(st.integers(0, 500), st.integers(0, 100), st.integers(0, 200))
def test_schedule_stays_between_its_bounds(v: int, warmup: int, extra: int) -> None:
    kw = {"kind": "warmup-cosine", "start": 0.5, "peak": 2.0, "end": 0.25}
    x = schedule_factor(v, **kw, warmup=warmup, versions=max(1, warmup + extra))
    assert 0.25 <= x <= 2.0


def test_weighted_mean() -> None:
    a = np.array([1, 2], np.float32)
    b = np.array([3, 6], np.float32)
    np.testing.assert_allclose(weighted_mean([a, b], [1, 3]), [2.5, 5.0])
    assert weighted_mean([a], [2]).dtype == np.float32
    with pytest.raises(ValueError, match="weights"):
        weighted_mean([a, b], [1])
    with pytest.raises(ValueError, match="> 0"):
        weighted_mean([a], [0])
    with pytest.raises(ValueError, match="no arrays"):
        weighted_mean([], [])


def test_outer_sgd_and_nesterov() -> None:
    p = np.zeros(2, np.float32)
    OuterOptimizer(kind="sgd", lr=0.5).step(p, np.array([2, 4], np.float32))
    np.testing.assert_allclose(p, [1, 2])
    q = np.zeros(1, np.float32)
    opt = OuterOptimizer(kind="nesterov", lr=1.0, momentum=0.5)
    d = np.ones(1, np.float32)
    opt.step(q, d)  # v = 1, step = d + 0.5 v = 1.5
    np.testing.assert_allclose(q, [1.5])
    opt.step(q, d)  # v = 1.5, step = 1 + 0.75
    np.testing.assert_allclose(q, [3.25])
    clone = OuterOptimizer(kind="nesterov", lr=1.0, momentum=0.5)
    clone.load_state_dict(opt.state_dict())
    r1, r2 = q.copy(), q.copy()
    opt.step(r1, d)
    clone.step(r2, d)
    assert np.array_equal(r1, r2)
    with pytest.raises(ValueError, match="unknown kind"):
        OuterOptimizer(kind="adam")


def test_a_strategy_step_scale_follows_its_schedule_section_when_replaced() -> None:
    """``Strategy.step_scale`` dumps the (frozen) section once; a new section counts."""
    from coordinator.core.strategyconfig import ScheduleSection
    from tests.coordinator.coord_helpers import make_core

    ramp = {"kind": "warmup-cosine", "start": 0.5, "warmup": 4, "versions": 4}
    core = make_core(strategy={"schedule": ramp})
    strategy = core.strategy
    assert strategy.step_scale() == 0.5  # version 0 of the ramp
    core.model.version = 2
    assert strategy.step_scale() == 0.75
    section = ScheduleSection(kind="constant")
    strategy.config = strategy.config.model_copy(update={"schedule": section})
    assert strategy.step_scale() == 1.0


@pytest.mark.parametrize("kind", ["sgd", "nesterov"])
@pytest.mark.parametrize("k", [1, 4, 64])
def test_k_arrivals_move_the_params_as_one_round_of_their_mean(kind: str, k: int) -> None:
    """Asynchronous DiLoCo: K arrivals at share 1/K against one synchronous
    round, 30 rounds of the same direction. One arrival (K = 1) is the round's
    step exactly; more stay within 5 % of it (the velocity decays between
    arrivals), not K times as far."""
    d = np.ones(3, np.float32)
    rounds, arrivals = OuterOptimizer(kind=kind, lr=0.7), OuterOptimizer(kind=kind, lr=0.7)
    p, q = np.zeros(3, np.float32), np.zeros(3, np.float32)
    for _ in range(30):
        rounds.step(p, d)
        for _ in range(k):
            arrivals.arrival(q, d, 1 / k)
    if k == 1:
        np.testing.assert_allclose(q, p, rtol=1e-6)
    else:
        np.testing.assert_allclose(q, p, rtol=0.05)
