import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulations.engine import Engine, EngineError, Priority


def test_earlier_time_runs_first():
    eng = Engine()
    log = []
    eng.schedule(2.0, log.append, "b")
    eng.schedule(1.0, log.append, "a")
    eng.run_until()
    assert log == ["a", "b"]
    assert eng.now == 2.0


def test_equal_time_lower_priority_first_then_fifo():
    eng = Engine()
    log = []
    eng.schedule(1.0, log.append, "tick", priority=Priority.TICK)
    eng.schedule(1.0, log.append, "deliver1", priority=Priority.DELIVERY)
    eng.schedule(1.0, log.append, "churn", priority=Priority.CHURN)
    eng.schedule(1.0, log.append, "deliver2", priority=Priority.DELIVERY)
    eng.schedule(1.0, log.append, "compute", priority=Priority.COMPUTE)
    eng.run_until()
    assert log == ["churn", "deliver1", "deliver2", "compute", "tick"]


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2)), max_size=40))
def test_order_is_sorted_key_with_schedule_order_tiebreak(items):
    eng = Engine()
    log = []
    for i, (t, p) in enumerate(items):
        eng.schedule_at(float(t), log.append, (t, p, i), priority=p)
    eng.run_until()
    assert log == sorted(log)


def test_events_scheduled_during_run_at_same_time_run_after_current():
    eng = Engine()
    log = []

    def first():
        log.append("first")
        eng.schedule(0.0, log.append, "child")

    eng.schedule(1.0, first)
    eng.schedule(1.0, log.append, "sibling")
    eng.run_until()
    assert log == ["first", "sibling", "child"]


def test_cancel_and_pending():
    eng = Engine()
    log = []
    ev = eng.schedule(1.0, log.append, "x")
    eng.schedule(2.0, log.append, "y")
    assert eng.pending() == 2
    eng.cancel(ev)
    eng.cancel(ev)
    assert eng.pending() == 1
    eng.run_until()
    assert log == ["y"]
    eng.cancel(ev)  # after the fact: harmless


def test_run_until_time_advances_clock_and_includes_boundary():
    eng = Engine()
    log = []
    eng.schedule(1.0, log.append, 1)
    eng.schedule(2.0, log.append, 2)
    eng.schedule(3.0, log.append, 3)
    assert eng.run_until(2.0) == 2.0
    assert log == [1, 2]
    assert eng.run_until(2.5) == 2.5
    assert log == [1, 2]


def test_run_until_predicate_and_max_events():
    eng = Engine()
    count = []
    for i in range(10):
        eng.schedule(float(i), count.append, i)
    eng.run_until(until=lambda: len(count) >= 3)
    assert count == [0, 1, 2]
    eng.run_until(max_events=2)
    assert count == [0, 1, 2, 3, 4]


def test_scheduling_in_the_past_or_non_finite_is_an_error():
    eng = Engine()
    eng.run_until(5.0)
    with pytest.raises(EngineError, match="before now"):
        eng.schedule_at(4.0, lambda: None)
    with pytest.raises(EngineError, match="finite"):
        eng.schedule(float("inf"), lambda: None)


def test_streams_are_deterministic_and_independent_of_creation_order():
    a = Engine(seed=7)
    b = Engine(seed=7)
    a_first = a.rng("client/1").random(4)
    b.rng("client/0").random(100)  # another stream used first
    b_first = b.rng("client/1").random(4)
    np.testing.assert_array_equal(a_first, b_first)
    assert not np.array_equal(a.rng("client/2").random(4), Engine(seed=8).rng("client/2").random(4))
    assert not np.array_equal(Engine(seed=7).rng("x").random(4), Engine(seed=7).rng("y").random(4))
