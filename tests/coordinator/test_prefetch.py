"""Prefetch (docs/protocol.md §3.12): a second, queued lease behind the one a client
computes, only when it asks, only under decentral-async."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.core import events as ev
from coordinator.core.leases import LeaseBook, LeaseError, LeaseState, TaskPlan
from protocol import messages as m
from protocol.limits import data_cap
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

#: prefetch is offered by default to slow links only (``lease.prefetch = "auto"``):
#: these tests give it to every connection
PREFETCH = {"prefetch": True}


def test_the_default_job_on_lan_does_not_offer_prefetch() -> None:
    """Not on a fast link (docs/coordinator.md): a prefetched task would train from
    the model before its client's own last result, and hide no transfer."""
    core = make_core()
    out = core.connect("a", hello("a"), 0.0)
    assert sent(out, "a", m.Welcome)[0].prefetch is False
    first = task_of(out, "a")
    assert sent(core.receive("a", m.Prefetch(task_id=first.task_id), 0.5), "a", m.Task) == []


def test_auto_offers_prefetch_to_the_connections_whose_link_sets_their_task() -> None:
    """Per connection: on one lan job, a volunteer who capped its data gets
    prefetch and its neighbour does not; on a roblox job every client does, and
    a job that says no offers it to none."""
    core = make_core(strategy={"tau": "auto"})
    out = core.connect("capped", hello("capped", limits=data_cap(10.0)), 0.0)
    assert sent(out, "capped", m.Welcome)[0].prefetch is True
    out = core.connect("lan", hello("lan"), 0.0)
    assert sent(out, "lan", m.Welcome)[0].prefetch is False

    for allowed, offered in (("auto", True), (False, False)):
        core = make_core(strategy={"tau": "auto"}, link={"profile": "roblox"},
                         lease={"prefetch": allowed})  # fmt: skip
        out = core.connect("a", hello("a", codecs=("fp32", "int8")), 0.0)
        assert sent(out, "a", m.Welcome)[0].prefetch is offered


@pytest.mark.parametrize(
    ("tau", "prefetch", "served"),
    [("auto", "auto", True), (2, "auto", False), (2, True, True), ("auto", False, False)],
)
def test_a_prefetch_is_served_where_the_running_task_hides_a_download(
    tau: int | str, prefetch: bool | str, served: bool
) -> None:
    """Under auto, a roblox client's auto-sized task computes its round trip, so
    the next model downloads while it runs: served. Two steps compute for
    milliseconds against a download of seconds: a queued task would only add one
    to the client's tasks in flight, so the prefetch is ignored (unless the job
    says true)."""
    uncapped = {"tau": tau, "max_epochs": 10**4, "tau_max": 10**6}  # not one pass of digits
    core = make_core(strategy=uncapped, link={"profile": "roblox"}, lease={"prefetch": prefetch})
    out = core.connect("a", hello("a", codecs=("fp32", "int8")), 0.0)
    (first,) = only(out, ev.TaskLeased)  # its frames wait for its paced link
    out = core.receive("a", m.Prefetch(task_id=str(first.task_id)), 0.5)
    assert [t.queued for t in only(out, ev.TaskLeased)] == ([True] if served else [])


def test_a_prefetching_clients_task_computes_its_round_trip_not_five() -> None:
    """Its transfers run while it computes: ``prefetch_transfer_ratio`` (1) times its
    round trip, where a client without prefetch computes ``transfer_ratio`` (5)
    times it so that its link is a small part of each task."""
    sizing = {"tau": "auto", "tau_max": 10**6, "max_epochs": 10**4, "task_seconds": 0.01}

    def steps(prefetch: bool | str) -> int:
        core = make_core(strategy=sizing, link={"profile": "roblox"}, lease={"prefetch": prefetch})
        return task_of(core.connect("a", hello("a", codecs=("fp32", "int8")), 0.0), "a").steps

    auto, off = steps("auto"), steps(False)
    assert off / auto == pytest.approx(5.0, rel=0.02)
    assert steps(True) == auto


@pytest.mark.parametrize(
    ("strategy", "allowed", "offered"),
    [
        ("decentral-async", True, True),
        ("central-async", True, False),
        ("decentral-async", False, False),
        ("decentral-sync", True, False),
        ("central-sync", True, False),
    ],
)
def test_welcome_offers_prefetch_where_the_job_and_strategy_allow_it(
    strategy: str, allowed: bool, offered: bool
) -> None:
    core = make_core(strategy, lease={"prefetch": allowed})
    out = core.connect("a", hello("a"), 0.0)
    assert sent(out, "a", m.Welcome)[0].prefetch is offered
    first = task_of(out, "a")
    out = core.receive("a", m.Prefetch(task_id=first.task_id), 0.5)
    assert len(sent(out, "a", m.Task)) == int(offered)


def test_a_prefetch_queues_the_next_task_behind_the_running_one() -> None:
    core = make_core(lease=PREFETCH)
    first = task_of(core.connect("a", hello("a"), 0.0), "a")
    b_task = task_of(core.connect("b", hello("b"), 0.0), "b")
    deliver(core, "b", result_messages(b_task), 0.5)
    # the model moved to version 1; a asks for its next task while still computing
    out = core.receive("a", m.Prefetch(task_id=first.task_id), 1.0)
    nxt = task_of(out, "a")
    assert nxt.model_version == core.version == 1
    assert nxt.delta_base is None and nxt.num_chunks > 0  # no delta codec: the whole model
    (leased,) = only(out, ev.TaskLeased)
    assert leased.queued and leased.task_id == int(nxt.task_id)
    book = core.book
    assert book.live_lease_of("a").task_id == int(first.task_id)
    assert book.queued_lease_of("a").task_id == int(nxt.task_id)
    # a second prefetch while one is queued does nothing
    assert sent(core.receive("a", m.Prefetch(task_id=first.task_id), 1.1), "a", m.Task) == []
    # the running task's result is applied; no new task: the queued one becomes current
    out = deliver(core, "a", result_messages(first), 2.0)
    assert acks(out, "a") == [(first.task_id, True, "")]
    assert sent(out, "a", m.Task) == []
    assert book.live_lease_of("a").task_id == int(nxt.task_id)
    assert book.queued_lease_of("a") is None
    # it holds the prefetched version: the task after it can be a delta from there
    assert core.registry.get("a").version_held == nxt.model_version
    # its result in turn frees it: a fresh task follows, as without prefetch
    out = deliver(core, "a", result_messages(nxt), 3.0)
    assert acks(out, "a") == [(nxt.task_id, True, "")] and task_of(out, "a")


@pytest.mark.parametrize(
    "why", ["unknown task", "sync strategy", "job says no", "no lease", "not its current task"]
)
def test_a_prefetch_that_cannot_be_served_is_ignored(why: str) -> None:
    core = make_core(
        "decentral-sync" if why == "sync strategy" else "decentral-async",
        lease={"prefetch": why != "job says no"},
    )
    first = task_of(core.connect("a", hello("a"), 0.0), "a")
    tid = first.task_id
    if why == "unknown task":
        tid = "999"
    elif why == "no lease":
        deliver(core, "a", result_messages(first), 0.5)
        core.book.end(core.book.live_lease_of("a"), LeaseState.CANCELLED, 0.6)
    elif why == "not its current task":
        tid = str(int(first.task_id) + 1)
    out = core.receive("a", m.Prefetch(task_id=tid), 1.0)
    assert not [o for o in out if isinstance(o, ev.Close)]  # never an error: sides race
    assert [t for t in only(out, ev.TaskLeased) if t.queued] == []
    assert core.book.queued_lease_of("a") is None


def test_leaving_ends_both_leases_and_a_late_result_is_refused() -> None:
    core = make_core(lease=PREFETCH)
    first = task_of(core.connect("a", hello("a"), 0.0), "a")
    nxt = task_of(core.receive("a", m.Prefetch(task_id=first.task_id), 0.5), "a")
    leases = [core.book.live_lease_of("a"), core.book.queued_lease_of("a")]
    out = core.disconnect("a", 1.0)
    assert only(out, ev.ClientLeft)
    assert [x.state for x in leases] == [LeaseState.LOST, LeaseState.LOST]
    assert core.book.live_lease_of("a") is None and core.book.queued_lease_of("a") is None
    assert core.book.leases_live() == []
    assert nxt.task_id != first.task_id


def test_an_expired_current_lease_promotes_the_queued_one() -> None:
    core = make_core(lease={**PREFETCH, "min_s": 5.0, "slack": 1.0})
    first = task_of(core.connect("a", hello("a"), 0.0), "a")
    nxt = task_of(core.receive("a", m.Prefetch(task_id=first.task_id), 1.0), "a")
    first_deadline = core.book.live_lease_of("a").deadline
    assert core.book.queued_lease_of("a").deadline > first_deadline  # it starts later
    out = core.tick(first_deadline + 0.01)
    assert [e.task_id for e in only(out, ev.LeaseExpired)] == [int(first.task_id)]
    assert sent(out, "a", m.Task) == []  # still busy with the queued task
    assert core.book.live_lease_of("a").task_id == int(nxt.task_id)
    # async keeps an expired task open for the resume grace: its late result is
    # still taken, and does not disturb the queued lease
    out = deliver(core, "a", result_messages(first), first_deadline + 0.5)
    assert acks(out, "a") == [(first.task_id, True, "")] and sent(out, "a", m.Task) == []
    assert core.book.live_lease_of("a").task_id == int(nxt.task_id)
    out = deliver(core, "a", result_messages(nxt), first_deadline + 1.0)
    assert acks(out, "a") == [(nxt.task_id, True, "")] and task_of(out, "a")


def test_lease_book_queues_at_most_one_lease_behind_the_current_one() -> None:
    released: list[str] = []
    book = LeaseBook(on_release=released.append)
    plan = TaskPlan(kind="local", shard=0, seed=0, steps=1, batch=1)
    t1, t2, t3 = (book.new_task(plan, version=0, now=0.0) for _ in range(3))
    with pytest.raises(LeaseError, match="queued"):
        book.lease(t1, "a", now=0.0, deadline=9.0, queued=True)  # nothing to queue behind
    cur = book.lease(t1, "a", now=0.0, deadline=9.0)
    q = book.lease(t2, "a", now=0.0, deadline=9.0, queued=True)
    with pytest.raises(LeaseError):
        book.lease(t3, "a", now=0.0, deadline=9.0, queued=True)
    with pytest.raises(LeaseError):
        book.lease(t3, "a", now=0.0, deadline=9.0)
    assert sorted(x.lease_id for x in book.leases_live()) == [cur.lease_id, q.lease_id]
    book.end(cur, LeaseState.DONE, 1.0)
    assert released == [] and book.live_lease_of("a") is q and book.queued_lease_of("a") is None
    book.end(q, LeaseState.DONE, 2.0)
    assert released == ["a"] and book.all_resolved()
    # a queued lease that ends first leaves the current one alone
    cur = book.lease(t3, "a", now=3.0, deadline=9.0)
    t4 = book.new_task(plan, version=0, now=3.0)
    q = book.lease(t4, "a", now=3.0, deadline=9.0, queued=True)
    book.end(q, LeaseState.EXPIRED, 4.0)
    assert book.live_lease_of("a") is cur and book.queued_lease_of("a") is None
    assert released == ["a"]


def test_a_result_for_the_prefetched_version_keeps_the_update_exact() -> None:
    """The queued task's update is merged like any other: from its own version."""
    core = make_core(lease=PREFETCH)
    first = task_of(core.connect("a", hello("a"), 0.0), "a")
    nxt = task_of(core.receive("a", m.Prefetch(task_id=first.task_id), 0.5), "a")
    deliver(core, "a", result_messages(first), 1.0)
    before = core.params.data.copy()
    update = np.full(core.params.num_params, 0.01, np.float32)
    out = deliver(core, "a", result_messages(nxt, update), 2.0)
    (acc,) = only(out, ev.ResultAccepted)
    assert acc.staleness == core.version - 1 - nxt.model_version
    assert not np.array_equal(core.params.data, before)


def test_declining_the_running_task_with_one_queued_does_not_spin_the_core() -> None:
    """The client declines its running task (it diverged) and goes on with the
    prefetched one: its decline back-off asks for no wakeup while it works, so the
    core's next wakeup is never in the past (it was: a driver ticking at once
    spun on it until the queued task ended; the large preset's 8 players)."""
    core = make_core(lease=PREFETCH)
    first = task_of(core.connect("a", hello("a"), 0.0), "a")
    queued = task_of(core.receive("a", m.Prefetch(task_id=first.task_id), 0.5), "a")
    out = core.receive("a", m.Decline(task_id=first.task_id, reason="diverged: not finite"), 1.0)
    assert sent(out, "a", m.Task) == []  # the queued task is its work now
    assert core.book.live_lease_of("a").task_id == int(queued.task_id)
    for now in (1.0, 1.5, 2.0, 5.0):  # the back-off ran out at 2.0
        core.tick(now)
        wake = core.next_wakeup()
        assert wake is None or wake > now
    # its result releases it: a fresh task once the back-off has run out
    out = deliver(core, "a", result_messages(queued), 6.0)
    assert acks(out, "a") == [(queued.task_id, True, "")] and task_of(out, "a")
