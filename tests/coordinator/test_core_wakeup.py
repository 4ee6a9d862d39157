"""Ticking exactly at ``next_wakeup()`` makes progress (no tick that repeats forever).

The core's checks and ``next_wakeup()`` must round the same way: a driver that
sleeps until the wakeup time and finds nothing due would wake at that same time
again, forever. The times here are chosen so that ``now - start >= limit`` and
``now >= start + limit`` disagree for naive implementations.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core import events as ev
from protocol import messages as m
from protocol.errors import ErrorCode
from tests.coordinator.coord_helpers import hello, make_core, only, sent

starts = st.floats(min_value=0.0, max_value=1e5, allow_nan=False, allow_infinity=False)
spans = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)


def test_known_rounding_cases_make_progress() -> None:
    # 0.7 + 0.3 rounds below 1.0: exactly where a subtraction-based check fails.
    core = make_core(lease={"resume_grace_s": 0.3, "heartbeat_timeout_s": 1e6})
    task = sent(core.connect("a", hello("a"), 0.1), "a", m.Task)[0]
    core.disconnect("a", 0.7)
    wake = core.next_wakeup()
    assert wake == 0.7 + 0.3
    core.tick(wake)
    assert core.book.outcome(int(task.task_id)) is None  # dropped
    assert core.next_wakeup() is None


@settings(max_examples=25, deadline=None)
@given(start=starts, grace=spans, gap=spans)
def test_orphan_grace_ends_at_next_wakeup(start: float, grace: float, gap: float) -> None:
    core = make_core(lease={"resume_grace_s": grace, "heartbeat_timeout_s": 1e9})
    task = sent(core.connect("a", hello("a"), start), "a", m.Task)[0]
    core.disconnect("a", start + gap)
    wake = core.next_wakeup()
    assert wake is not None
    core.tick(wake)
    assert core.book.outcome(int(task.task_id)) is None  # dropped
    assert core.next_wakeup() is None


@settings(max_examples=25, deadline=None)
@given(start=starts, timeout=st.floats(min_value=2e-3, max_value=1e3))
def test_heartbeat_timeout_closes_at_next_wakeup(start: float, timeout: float) -> None:
    core = make_core(
        lease={"heartbeat_interval_s": 1e-3, "heartbeat_timeout_s": timeout, "min_s": 1e6}
    )
    core.connect("a", hello("a"), start)
    wake = core.next_wakeup()
    assert wake is not None and wake > start
    out = core.tick(wake)
    assert sent(out, "a", m.Error)[0].code == ErrorCode.TIMEOUT
    assert "a" not in core.conns


@settings(max_examples=25, deadline=None)
@given(start=starts, limit=spans)
def test_max_time_finishes_at_next_wakeup(start: float, limit: float) -> None:
    core = make_core(lease={"heartbeat_timeout_s": 1e9, "min_s": 1e6}, stop={"max_time_s": limit})
    core.connect("a", hello("a"), start)
    wake = core.next_wakeup()
    assert wake is not None
    out = core.tick(wake)
    assert only(out, ev.JobFinished)[0].reason == "max_time"
