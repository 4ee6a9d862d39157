import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.core.strategies.aggregate import (
    OUTER_LR_AUTO_MIN_SHARE,
    OuterLrScale,
    OuterOptimizer,
    effective_count,
    nesterov_edge,
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


def _radius_after(lr: float, momentum: float, rounds: int = 400) -> float:
    """How far a Nesterov outer step leaves a direction its deltas solve exactly
    (delta = -x), after ``rounds`` rounds from 1."""
    x = np.ones(1, np.float32)
    opt = OuterOptimizer(kind="nesterov", lr=lr, momentum=momentum)
    for _ in range(rounds):
        opt.step(x, -x.copy())
    return abs(float(x[0]))


@pytest.mark.parametrize("momentum", [0.0, 0.5, 0.9])
def test_the_nesterov_edge_is_where_a_solved_direction_stops_converging(momentum: float) -> None:
    edge = nesterov_edge(momentum)
    assert _radius_after(0.97 * edge, momentum) < 1e-2
    assert _radius_after(1.03 * edge, momentum) > 1e2
    assert nesterov_edge(0.9) == pytest.approx(1.357, abs=1e-3)
    with pytest.raises(ValueError, match="momentum"):
        nesterov_edge(1.0)


def test_effective_count() -> None:
    assert effective_count([3.0] * 8) == pytest.approx(8)
    assert effective_count([1.0, 1.0, 1e6]) == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(ValueError, match="positive"):
        effective_count([0.0, 0.0])


def _rounds(k: int, *, signal: float, noise: float, rounds: int = 60, kind: str = "nesterov"):
    """The auto outer lr of ``rounds`` rounds of ``k`` deltas: a common direction
    of norm ``signal`` plus independent noise of norm about ``noise`` each."""
    rng = np.random.default_rng(k)
    n = 4000
    mu = np.zeros(n, np.float32)
    mu[0] = signal
    scale = OuterLrScale(kind=kind, momentum=0.9)
    lrs = []
    for _ in range(rounds):
        deltas = [mu + rng.normal(0, noise / n**0.5, n).astype(np.float32) for _ in range(k)]
        lrs.append(scale.observe(deltas, [1.0] * k, np.mean(deltas, axis=0)))
    return lrs, scale


def test_noise_free_rounds_step_at_the_peak_and_plain_averaging_at_one() -> None:
    lrs, _ = _rounds(8, signal=1.0, noise=0.0)
    peak = 0.95 * nesterov_edge(0.9)
    assert lrs[-1] == pytest.approx(peak, rel=1e-6)
    sgd, _ = _rounds(8, signal=1.0, noise=0.0, kind="sgd")
    assert sgd[-1] == pytest.approx(1.0)


def test_the_step_grows_with_the_deltas_a_round_averages() -> None:
    """Each delta's noise four times its signal (a noise scale of 16 deltas): the
    share of the mean that is signal is k / (k + 16), so 64 deltas step near the
    peak and 2 a small fraction of it."""
    peak = 0.95 * nesterov_edge(0.9)
    got = {k: float(np.mean(_rounds(k, signal=1.0, noise=4.0)[0][-20:])) for k in (2, 8, 64)}
    assert got[2] < got[8] < got[64]
    for k, lr in got.items():
        assert lr == pytest.approx(peak * k / (k + 16), rel=0.25), k


def test_deltas_of_pure_noise_step_at_the_floor_and_never_stop() -> None:
    lrs, scale = _rounds(4, signal=0.0, noise=1.0)
    peak = 0.95 * nesterov_edge(0.9)
    assert lrs[-1] == pytest.approx(OUTER_LR_AUTO_MIN_SHARE * peak)
    assert min(lrs) > 0
    assert scale.noise == pytest.approx(1.0 / 4, rel=0.1)  # sigma² / K


def test_a_round_over_every_shard_has_no_noise_from_the_shards_it_saw() -> None:
    """Sampling without replacement: deltas that disagree, from every shard of the
    job, average to the whole data's direction; half the shards keep half the
    noise."""
    d = np.ones(10, np.float32)
    pair = [d + 1.0, d - 1.0]  # spread 10 each about the mean: sigma² = 20
    peak = 0.95 * nesterov_edge(0.9)
    whole = OuterLrScale(kind="nesterov", momentum=0.9)
    assert whole.observe(pair, [1.0, 1.0], d, coverage=1.0) == pytest.approx(peak)
    assert whole.noise == 0.0
    half = OuterLrScale(kind="nesterov", momentum=0.9)
    half.observe(pair, [1.0, 1.0], d, coverage=0.5)
    assert half.noise == pytest.approx(20.0 / 2 * 0.5)
    with pytest.raises(ValueError, match="coverage"):
        half.observe(pair, [1.0, 1.0], d, coverage=1.5)


def test_one_delta_a_round_uses_the_prior_then_the_spread_it_has_seen() -> None:
    scale = OuterLrScale(kind="nesterov", momentum=0.9)
    peak = 0.95 * nesterov_edge(0.9)
    d = np.ones(10, np.float32)
    assert scale.observe([d], [1.0], d) == pytest.approx(peak / 8)  # k / (k + 7) at k = 1
    assert scale.noise is None
    clone = OuterLrScale(kind="nesterov", momentum=0.9)
    clone.load_state_dict(scale.state_dict())
    assert (clone.noise, clone.signal) == (scale.noise, scale.signal)
    pair = [d, -d]  # a round of two that disagree: all noise, sigma² = 20
    scale.observe(pair, [1.0, 1.0], np.zeros(10, np.float32))
    assert scale.noise == pytest.approx(20.0 / 2)
    assert scale.observe([d], [1.0], d) < peak / 8
    with pytest.raises(ValueError, match="deltas"):
        scale.observe([d], [1.0, 2.0], d)


@given(
    st.lists(
        st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=3, max_size=3),
        min_size=1,
        max_size=6,
    ),
    st.lists(st.floats(0.1, 100), min_size=6, max_size=6),
    st.floats(0, 1),
    st.sampled_from(["sgd", "nesterov"]),
)
def test_the_auto_outer_lr_stays_between_the_floor_and_the_peak(
    rows: list[list[float]], weights: list[float], coverage: float, kind: str
) -> None:
    scale = OuterLrScale(kind=kind, momentum=0.9)
    deltas = [np.array(r, np.float32) for r in rows]
    w = weights[: len(deltas)]
    for _ in range(3):
        lr = scale.observe(deltas, w, weighted_mean(deltas, w), coverage)
        assert OUTER_LR_AUTO_MIN_SHARE * scale.peak - 1e-9 <= lr <= scale.peak + 1e-9
