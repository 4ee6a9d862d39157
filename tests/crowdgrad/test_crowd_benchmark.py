"""benchmarks/crowd.py's arithmetic: the anchor's settled accuracy is one its own
curve reaches (the target every crowd row is timed to)."""

from __future__ import annotations

from crowdgrad.anchor import time_to
from tests.bench_module import load_benchmark

crowd = load_benchmark("crowd")


def test_the_settled_accuracy_is_reached_by_the_curve_it_comes_from() -> None:
    # one point in the last tenth: rounding 0.97327 up to 0.9733 made it unreachable
    curve = [(1.0, 0.9), (4.0, 0.96), (5.0, 0.97327)]
    target = crowd.settled(curve, 5.0)
    assert target == 0.9732 and time_to(curve, target) == 5.0


def test_the_settled_accuracy_is_the_mean_of_the_last_tenth() -> None:
    curve = [(t / 10, 0.5 + t / 1000) for t in range(101)]  # 0.5 .. 0.6 over 10 s
    # the last tenth: t from 9.0 to 10.0, accuracies 0.59 .. 0.6, mean 0.595
    assert crowd.settled(curve, 10.0) == 0.595
    assert time_to(curve, crowd.settled(curve, 10.0)) == 9.5


def test_join_times_are_seconds_after_the_start_in_order() -> None:
    dash = {"clients": [{"joined": 103.25}, {"joined": 101.5}, {"joined": 102.0}]}
    assert crowd.join_times(dash, 100.0) == [1.5, 2.0, 3.25]
