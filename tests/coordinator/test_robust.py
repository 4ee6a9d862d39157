"""Robust aggregation rules: a minority of arbitrary updates cannot move the result
far from the honest ones, and with no attackers each rule stays near the mean."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core.strategies.aggregate import weighted_mean
from coordinator.core.strategies.robust import (
    AGGREGATORS,
    SlidingWindow,
    aggregate,
    byzantine_count,
    centered_clip,
    multi_krum,
    small_median,
    trimmed_mean,
)
from tests.coordinator.coord_helpers import deliver, hello, make_core, result_messages, task_of

ROBUST = [a for a in AGGREGATORS if a != "mean"]


def _crowd(rng: np.random.Generator, honest: int, bad: int, attack: str, dim: int = 50):
    centre = rng.normal(size=dim).astype(np.float32)
    good = [centre + 0.1 * rng.normal(size=dim).astype(np.float32) for _ in range(honest)]
    mean = np.mean(good, axis=0)
    if attack == "scaled":
        evil = [(-10.0 * mean).astype(np.float32)] * bad
    elif attack == "huge":
        evil = [np.full(dim, 1000.0, np.float32)] * bad
    else:  # a little is enough: just outside the honest spread, all the same way
        sd = np.std(good, axis=0)
        evil = [(mean - 1.5 * sd).astype(np.float32)] * bad
    return centre, good, evil


@pytest.mark.parametrize("attack", ["scaled", "huge", "alie"])
@pytest.mark.parametrize("rule", ROBUST)
def test_robust_rules_stay_near_the_honest_centre(rule: str, attack: str) -> None:
    rng = np.random.default_rng(7)
    centre, good, evil = _crowd(rng, honest=16, bad=4, attack=attack)
    out = aggregate(rule, good + evil, byzantine_fraction=0.2)
    honest_err = np.linalg.norm(np.mean(good, axis=0) - centre)
    assert np.linalg.norm(out - centre) < honest_err + 0.5 * np.linalg.norm(0.1 * np.ones(50))
    if attack != "alie":  # the plain mean is dragged far away by the same crowd
        assert np.linalg.norm(aggregate("mean", good + evil) - centre) > 5.0


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 12), seed=st.integers(0, 2**31), rule=st.sampled_from(AGGREGATORS))
def test_without_attackers_each_rule_is_near_the_mean(n: int, seed: int, rule: str) -> None:
    rng = np.random.default_rng(seed)
    ups = [rng.normal(size=8).astype(np.float32) * 0.01 + 1.0 for _ in range(n)]
    out = aggregate(rule, ups, byzantine_fraction=0.2)
    assert out.dtype == np.float32 and out.shape == (8,)
    lo, hi = np.min(ups, axis=0), np.max(ups, axis=0)
    assert np.all(out >= lo - 1e-5) and np.all(out <= hi + 1e-5)  # inside the honest box


def test_mean_is_the_weighted_mean_and_edge_cases() -> None:
    ups = [np.array([1.0, 2.0], np.float32), np.array([3.0, 6.0], np.float32)]
    np.testing.assert_array_equal(aggregate("mean", ups, [1.0, 3.0]), weighted_mean(ups, [1, 3]))
    np.testing.assert_array_equal(trimmed_mean(ups, 0), weighted_mean(ups, [1, 1]))
    assert byzantine_count(10, 0.2) == 2 and byzantine_count(3, 0.49) == 1
    assert byzantine_count(1, 0.4) == 0
    with pytest.raises(ValueError, match="cannot trim"):
        trimmed_mean(ups, 1)
    with pytest.raises(ValueError, match="unknown 'avg'"):
        aggregate("avg", ups)


def test_krum_averages_the_honest_cluster_and_clip_is_order_free() -> None:
    rng = np.random.default_rng(1)
    _, good, evil = _crowd(rng, honest=8, bad=2, attack="huge")
    np.testing.assert_allclose(multi_krum(good + evil, f=2), np.mean(good, axis=0), atol=1e-6)
    a = centered_clip(good + evil)
    b = centered_clip(evil + good[::-1])
    np.testing.assert_allclose(a, b, atol=1e-6)


def _arrivals(rng: np.random.Generator, n: int, bad_every: int | None, dim: int = 50):
    """A stream of honest deltas around one centre, every ``bad_every``-th scaled ×−10."""
    centre = rng.normal(size=dim).astype(np.float32)
    out = []
    for i in range(n):
        d = centre + 0.3 * rng.normal(size=dim).astype(np.float32)
        out.append((-10.0 * d).astype(np.float32) if bad_every and i % bad_every == 3 else d)
    return centre, out


@pytest.mark.parametrize("rule", ["centered_clip", "median"])
def test_a_sliding_window_outvotes_a_fifth_of_bad_arrivals(rule: str) -> None:
    """FedAsync with window 8: the steps taken sum to about the honest deltas' sum,
    where stepping by each delta alone (window 1) is dragged backwards."""
    rng = np.random.default_rng(3)
    centre, deltas = _arrivals(rng, 200, bad_every=5)
    window = SlidingWindow(8, 50, rule)
    total = sum(window.push(d) for d in deltas)
    alone = sum(deltas)
    honest = 200 * centre
    cos = float(total @ honest / np.linalg.norm(total) / np.linalg.norm(honest))
    assert cos > 0.99 and 0.6 < np.linalg.norm(total) / np.linalg.norm(honest) < 1.2
    assert float(alone @ honest) < 0  # the plain sum points the wrong way


def test_a_sliding_window_without_attackers_moves_as_far_as_the_deltas() -> None:
    rng = np.random.default_rng(4)
    _, deltas = _arrivals(rng, 200, bad_every=None)
    for rule in ("mean", "centered_clip"):
        window = SlidingWindow(8, 50, rule)
        total = sum(window.push(d) for d in deltas)
        assert np.linalg.norm(total - sum(deltas)) < 0.05 * np.linalg.norm(sum(deltas)), rule
    one = SlidingWindow(8, 50, "centered_clip")
    np.testing.assert_array_equal(one.push(deltas[0]), deltas[0])  # nothing to outvote yet


def test_a_sliding_window_resumes_bitwise_from_its_state() -> None:
    rng = np.random.default_rng(5)
    _, deltas = _arrivals(rng, 40, bad_every=4)
    a = SlidingWindow(8, 50, "centered_clip")
    for d in deltas[:17]:
        a.push(d)
    b = SlidingWindow(8, 50, "centered_clip")
    b.load_state_dict(a.state_dict())
    for d in deltas[17:]:
        np.testing.assert_array_equal(a.push(d), b.push(d))
    with pytest.raises(ValueError, match="unknown 'avg'"):
        SlidingWindow(8, 50, "avg")


def test_a_window_used_in_part_combines_only_the_newest_deltas() -> None:
    rng = np.random.default_rng(6)
    _, deltas = _arrivals(rng, 30, bad_every=None)
    part = SlidingWindow(8, 50, "mean")
    for i, d in enumerate(deltas):
        step = part.push(d, use=3)
        newest = deltas[max(0, i - 2) : i + 1]
        np.testing.assert_allclose(step, np.mean(newest, axis=0), rtol=1e-5, atol=1e-7)
    alone = SlidingWindow(8, 50, "centered_clip")
    for d in deltas:
        np.testing.assert_array_equal(alone.push(d, use=0), d)  # at least the delta itself


def test_an_auto_window_scales_with_the_crowd() -> None:
    """Under 16 connected clients an "auto" FedAsync step is the delta alone, bitwise
    classic FedAsync; with 64 it combines 16 deltas."""

    def run(window: object, clients: int) -> tuple[np.ndarray, int | None]:
        core = make_core(strategy={"window": window})
        tasks = {c: task_of(core.connect(c, hello(c), 0.0), c) for c in map(str, range(clients))}
        rng = np.random.default_rng(0)
        for step, (c, task) in enumerate(list(tasks.items())[:6]):
            update = rng.normal(0, 1e-3, core.params.num_params).astype(np.float32)
            deliver(core, c, result_messages(task, update), 1.0 + step)
        return core.params.data.copy(), core.strategy.crowd

    auto, crowd = run("auto", 15)
    classic, _ = run(1, 15)
    assert crowd == 15
    np.testing.assert_array_equal(auto, classic)
    wide, crowd = run("auto", 64)
    assert crowd == 64 and not np.array_equal(wide, run(1, 64)[0])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.floats(allow_nan=False, width=64),
            st.sampled_from([0.0, 1.0, 1.0, 2.5, 1e308, -1e308]),  # ties, overflow
        ),
        min_size=1,
        max_size=40,
    )
)
def test_small_median_is_np_median_bit_for_bit(values: list[float]) -> None:
    x = np.array(values, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # 1e308 + 1e308, inf - inf
        want = float(np.median(x))
    got = small_median(x)
    assert np.array_equal(np.float64(got), np.float64(want), equal_nan=True), (got, want)


def test_small_median_of_nan_is_np_medians() -> None:
    x = np.array([1.0, np.nan, 3.0])
    assert np.isnan(small_median(x)) and np.isnan(np.median(x))
