"""The divergence back-off (coordinator/core/strategies/divergence.py): tasks whose
training was not finite lower the lr of later tasks, when they are most of the
tasks that came back at it; accepted results at that lr outvote false claims."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.core import events as ev
from coordinator.core.strategies.divergence import CUT, FLOOR, REPORTS_MIN, DivergenceGuard
from protocol import messages as m
from tests.coordinator.coord_helpers import (
    acks,
    deliver,
    hello,
    make_core,
    only,
    result_messages,
    task_of,
)

DIVERGED = "diverged: the update is not finite"


def test_one_report_is_not_a_pattern_two_are():
    g = DivergenceGuard()
    assert REPORTS_MIN == 2
    assert not g.diverged(0, 1.0, next_task_id=5)
    assert g.cap == math.inf
    assert g.diverged(1, 0.8, next_task_id=5)
    assert g.cap == CUT * 1.0 and g.cuts == 1  # half the highest lr reported


def test_accepted_results_at_the_lr_outvote_the_reports():
    g = DivergenceGuard()
    for tid in range(3):
        g.accepted(tid)
    for tid in range(3, 6):  # three reports against three accepted: not most
        assert not g.diverged(tid, 1.0, next_task_id=10)
    assert g.diverged(6, 1.0, next_task_id=10)  # the fourth is a majority
    assert g.cap == CUT


def test_tasks_issued_before_a_cut_count_neither_way():
    g = DivergenceGuard()
    g.diverged(0, 1.0, next_task_id=4)
    g.diverged(1, 1.0, next_task_id=4)
    assert g.cap == 0.5
    for tid in (2, 3):  # in flight at the cut, at the old lr: the cut answered them
        assert not g.diverged(tid, 1.0, next_task_id=9)
        g.accepted(tid)
    assert g.cap == 0.5
    g.diverged(4, 0.5, next_task_id=9)
    assert g.diverged(5, 0.5, next_task_id=9)
    assert g.cap == 0.25


@given(st.lists(st.tuples(st.booleans(), st.floats(1e-6, 1e3)), max_size=200))
def test_the_cap_only_falls_and_never_under_the_floor(events):
    g = DivergenceGuard()
    caps = [g.cap]
    for tid, (diverged, scale) in enumerate(events):
        if diverged:
            g.diverged(tid, min(scale, g.cap), next_task_id=tid + 1)
        else:
            g.accepted(tid)
        caps.append(g.cap)
    assert all(b <= a for a, b in itertools.pairwise(caps))
    assert caps[-1] >= FLOOR


def test_the_guard_survives_a_checkpoint():
    g = DivergenceGuard()
    g.diverged(0, 1.0, next_task_id=3)
    g.diverged(1, 1.0, next_task_id=3)
    g.diverged(3, 0.5, next_task_id=7)
    again = DivergenceGuard()
    again.load_state_dict(g.state_dict())
    assert again.state_dict() == g.state_dict()
    assert again.diverged(4, 0.5, next_task_id=8) and again.cap == 0.25
    old = DivergenceGuard()
    old.load_state_dict(None)  # a checkpoint from before the guard
    assert old.cap == math.inf


def test_two_diverged_declines_halve_the_next_tasks_lr():
    core = make_core(lease={"heartbeat_timeout_s": 1e6})
    lr = core.job.strategy.lr
    t_a = task_of(core.connect("a", hello("a"), 0.0), "a")
    t_b = task_of(core.connect("b", hello("b"), 0.0), "b")
    assert t_a.optimizer["lr"] == pytest.approx(lr)
    out = core.receive("a", m.Decline(task_id=t_a.task_id, reason=DIVERGED), 1.0)
    assert only(out, ev.TaskDeclined)[0].reason == DIVERGED
    assert core.strategy.lr_scale() == 1.0  # one is not a pattern
    core.receive("b", m.Decline(task_id=t_b.task_id, reason=DIVERGED), 1.1)
    assert core.strategy.lr_scale() == CUT
    again = task_of(core.tick(2.5), "a")  # after a's decline back-off
    assert again.optimizer["lr"] == pytest.approx(CUT * lr)
    # the crowd's lr scaling works under the cap, never above it
    for _ in range(50):
        core.strategy.observe_concurrency(9)
    assert core.strategy.lr_scale() == CUT


def test_other_decline_reasons_do_not_touch_the_lr():
    core = make_core(lease={"heartbeat_timeout_s": 1e6})
    t_a = task_of(core.connect("a", hello("a"), 0.0), "a")
    t_b = task_of(core.connect("b", hello("b"), 0.0), "b")
    core.receive("a", m.Decline(task_id=t_a.task_id, reason="compute: diverged"), 1.0)
    core.receive("b", m.Decline(task_id=t_b.task_id, reason="memory"), 1.0)
    assert core.strategy.lr_scale() == 1.0


def test_non_finite_uploads_are_reports_too():
    core = make_core(lease={"heartbeat_timeout_s": 1e6})
    t_a = task_of(core.connect("a", hello("a"), 0.0), "a")
    t_b = task_of(core.connect("b", hello("b"), 0.0), "b")
    bad = np.full(core.params.num_params, np.nan, np.float32)
    out = deliver(core, "a", result_messages(t_a, bad), 1.0)
    assert acks(out, "a") == [(t_a.task_id, False, "nonfinite")]
    deliver(core, "b", result_messages(t_b, bad), 1.0)
    assert core.strategy.lr_scale() == CUT
    assert core.params.is_finite()


def test_a_false_claimer_cannot_cut_the_lr_while_others_deliver():
    core = make_core(lease={"heartbeat_timeout_s": 1e6, "min_s": 1e4})
    t_a = task_of(core.connect("a", hello("a"), 0.0), "a")
    t_m = task_of(core.connect("m", hello("m"), 0.0), "m")
    now = 0.0
    for _ in range(6):  # m declines every task it gets as diverged, a delivers twice
        now += 1.0
        core.receive("m", m.Decline(task_id=t_m.task_id, reason=DIVERGED), now)
        for _ in range(2):
            now += 0.1
            t_a = task_of(deliver(core, "a", result_messages(t_a), now), "a")
        wake = core.next_wakeup()  # m's decline back-off
        assert wake is not None
        now = max(now, wake)
        t_m = task_of(core.tick(now), "m")
    assert core.strategy.lr_scale() == 1.0
    assert core.strategy.divergence.cuts == 0
    assert t_m.optimizer["lr"] == pytest.approx(core.job.strategy.lr)


def test_gradient_tasks_take_no_lr_of_their_own():
    core = make_core("central-async", lease={"heartbeat_timeout_s": 1e6})
    t_a = task_of(core.connect("a", hello("a"), 0.0), "a")
    t_b = task_of(core.connect("b", hello("b"), 0.0), "b")
    for c, t in (("a", t_a), ("b", t_b)):
        core.receive(c, m.Decline(task_id=t.task_id, reason=DIVERGED), 1.0)
    assert core.strategy.lr_scale() == 1.0 and core.strategy.divergence.cuts == 0
