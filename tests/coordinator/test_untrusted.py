"""Results count only from the client holding the task's lease (or the session it
resumed): a guessed task id earns nothing and costs the real holder nothing."""

from __future__ import annotations

import numpy as np

from coordinator.core import events as ev
from protocol import messages as m
from tests.coordinator.coord_helpers import (
    acks,
    deliver,
    hello,
    make_core,
    only,
    result_messages,
    sent,
    task_of,
)


def test_a_result_for_another_clients_task_is_refused_and_the_holder_is_accepted() -> None:
    core = make_core()
    task_a = task_of(core.connect("a", hello("a"), 0.0), "a")
    task_b = task_of(core.connect("b", hello("b"), 0.0), "b")
    assert task_a.task_id != task_b.task_id
    forged = result_messages(task_a, np.zeros(task_a.spec.num_params, np.float32))
    out = deliver(core, "b", forged, 1.0)
    assert acks(out, "b") == [(task_a.task_id, False, "not_leased")]
    assert not only(out, ev.ResultAccepted)
    out = deliver(core, "a", result_messages(task_a), 2.0)
    assert acks(out, "a") == [(task_a.task_id, True, "")]
    assert core.accepted_results == 1


def test_a_resumed_session_may_still_answer_its_task() -> None:
    core = make_core()
    out = core.connect("a", hello("a"), 0.0)
    task = task_of(out, "a")
    token = sent(out, "a", m.Welcome)[0].resume_token
    core.disconnect("a", 1.0)
    core.connect("a2", hello("a", resume=token), 2.0)
    out = deliver(core, "a2", result_messages(task), 3.0)
    assert (task.task_id, True, "") in acks(out, "a2")


def test_a_fresh_session_of_the_same_name_may_not() -> None:
    core = make_core()
    task = task_of(core.connect("a", hello("a"), 0.0), "a")
    core.disconnect("a", 1.0)
    core.connect("a2", hello("a"), 2.0)  # no resume token: a new record
    out = deliver(core, "a2", result_messages(task), 3.0)
    assert (task.task_id, False, "not_leased") in acks(out, "a2")


def test_the_first_result_is_checked_against_the_coordinators_own_updates() -> None:
    """A poisoned first upload (1000.0 in every weight) is refused: the median norm
    comes from updates the coordinator computed itself, not from trusted first results."""
    core = make_core()
    ref = core.validator.median()
    assert ref is not None and 0 < ref < 10  # tau steps of SGD on digits
    task = task_of(core.connect("a", hello("a"), 0.0), "a")
    before = core.params.data.copy()
    out = deliver(core, "a", result_messages(task, np.full(task.spec.num_params, 1000.0)), 1.0)
    assert acks(out, "a") == [(task.task_id, False, "norm")]
    np.testing.assert_array_equal(core.params.data, before)


def test_a_long_update_that_passes_is_clipped_to_a_few_honest_ones() -> None:
    core = make_core()
    med = core.validator.median()
    assert med is not None
    task = task_of(core.connect("a", hello("a"), 0.0), "a")
    n = task.spec.num_params
    med *= task.steps  # the median is a norm per local step
    long = np.full(n, 5 * med / np.sqrt(n), np.float32)  # 5x the median: within 10x
    before = core.params.data.copy()
    out = deliver(core, "a", result_messages(task, long), 1.0)
    assert acks(out, "a") == [(task.task_id, True, "")]
    moved = float(np.linalg.norm((core.params.data - before).astype(np.float64)))
    alpha = core.job.strategy.alpha  # fedasync, staleness 0
    assert abs(moved - alpha * 3 * med) < 1e-4 * med


def test_refusals_fade_with_accepted_results() -> None:
    core = make_core()
    out = core.connect("a", hello("a"), 0.0)
    rec = core.registry.get("a")
    assert rec is not None
    now = 1.0
    task = task_of(out, "a")
    for i in range(8):  # alternate a refused and an accepted result: never closed
        bad = i % 2 == 0
        update = np.full(task.spec.num_params, 1000.0) if bad else None
        out = deliver(core, "a", result_messages(task, update), now)
        now += 1.0
        if bad:
            assert acks(out, "a")[-1][2] == "norm"
        tasks = sent(out, "a", m.Task)
        if tasks:
            task = tasks[-1]
        assert "a" in core.conns
    assert rec.rejections <= 1  # 4 refusals in all, limit 5: the count faded


def _closed_for_refusals(core, cid: str, address: str | None, now: float) -> str:
    """Connect ``cid`` and send refused updates until it is closed; its resume token."""
    out = core.connect(cid, hello(cid), now, address=address)
    token = only(out, ev.Send)[0].message.resume_token
    limit = core.job.validation.max_rejections
    for _ in range(limit):
        task = task_of(out, cid)
        out = deliver(core, cid, result_messages(task, np.full(task.spec.num_params, 1e3)), now)
        now += 1.0
    assert cid not in core.conns and only(out, ev.Close)
    return token


def test_a_poisoner_reconnecting_fresh_from_its_address_is_on_probation() -> None:
    """Issue 34: a fresh session (no resume token) came back with a clean count.
    One refused update now closes it again; another address starts clean."""
    core = make_core()
    _closed_for_refusals(core, "p1", "203.0.113.7", 1.0)
    out = core.connect("p2", hello("p2"), 20.0, address="203.0.113.7")
    task = task_of(out, "p2")
    out = deliver(core, "p2", result_messages(task, np.full(task.spec.num_params, 1e3)), 21.0)
    assert [r.reason for r in only(out, ev.ResultRejected)] == ["norm"]
    assert only(out, ev.Close) and "p2" not in core.conns
    out = core.connect("h", hello("h"), 22.0, address="198.51.100.1")
    task = task_of(out, "h")
    out = deliver(core, "h", result_messages(task, np.full(task.spec.num_params, 1e3)), 23.0)
    assert acks(out, "h")[-1][2] == "norm" and "h" in core.conns  # one of five


def test_probation_fades_with_accepted_results_and_follows_the_resume_id() -> None:
    core = make_core()
    token = _closed_for_refusals(core, "p1", None, 1.0)  # no address: the id alone
    assert core.registry.forget(before=19.0) == 1  # its record is gone: the mark is not
    out = core.connect("p2", m.Hello(client="p2", resume=token), 20.0)
    rec = core.registry.get("p2")
    assert rec is not None and rec.rejections == core.job.validation.max_rejections - 1
    task = task_of(out, "p2")
    deliver(core, "p2", result_messages(task), 21.0)  # an honest result
    assert rec.rejections == core.job.validation.max_rejections - 2


def test_refusal_marks_are_bounded_and_expire() -> None:
    from coordinator.core.refusals import RefusalMarks

    marks = RefusalMarks(max_keys=3, ttl_s=10.0)
    for i in range(5):
        marks.mark(RefusalMarks.keys(f"10.0.0.{i}", None), float(i))
    assert len(marks) == 3
    assert not marks.marked(["addr:10.0.0.0"], 5.0) and marks.marked(["addr:10.0.0.4"], 5.0)
    assert not marks.marked(["addr:10.0.0.4"], 14.5) and len(marks) == 2
