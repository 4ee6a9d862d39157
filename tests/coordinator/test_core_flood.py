"""A flood of short connections leaves state bounded by count (``lease.max_resumable``),
not only by time, while a client that left among the last ``max_resumable`` still
resumes and delivers (docs/protocol.md §6, docs/operations.md "Memory and pauses").

Every flood here fits in a few virtual seconds: well inside the resume grace (60 s)
and the retention (600 s), so only the count bounds what is kept.
"""

from __future__ import annotations

from coordinator.core import events as ev
from coordinator.core.machine import Coordinator
from protocol import messages as m
from testkit.fuzzing import fuzz
from tests.coordinator.coord_helpers import (
    acks,
    deliver,
    hello,
    make_core,
    only,
    result_messages,
    sent,
)

CAP = 40
OPEN_ENDED = {"target_accuracy": None, "max_versions": 10**9, "patience": 0}


def flood(core: Coordinator, n: int, t: float, *, prefix: str) -> float:
    """``n`` connections that each take a task and vanish at once, 1 ms apart."""
    for i in range(n):
        cid = f"{prefix}{i}"
        assert sent(core.connect(cid, hello(cid), t), cid, m.Task)
        core.disconnect(cid, t, "gone")
        t += 1e-3
    return t


def retained(core: Coordinator) -> dict[str, int]:
    return {
        "records": core.registry.known(),
        "tasks": len(core.book.tasks),
        "leases": len(core.book.leases),
        "outcomes": len(core.book.outcomes),
    }


def flood_core(**lease: float) -> Coordinator:
    return make_core(lease={"max_resumable": CAP, "heartbeat_timeout_s": 1e6, **lease})


def test_a_flood_of_connections_that_take_a_task_and_vanish_keeps_max_resumable() -> None:
    core = flood_core()
    t = flood(core, 2000, 0.0, prefix="h")
    # the last CAP to leave, each with the one task held open for it; a dropped task
    # leaves no outcome (a late result for it is stale by its id)
    assert retained(core) == {"records": CAP, "tasks": CAP, "leases": CAP, "outcomes": 0}
    flood(core, 2000, t, prefix="k")
    assert retained(core) == {"records": CAP, "tasks": CAP, "leases": CAP, "outcomes": 0}


def test_a_client_never_given_a_task_leaves_no_record() -> None:
    core = make_core("decentral-sync", strategy={"clients_per_round": 1})
    assert sent(core.connect("a", hello("a"), 0.0), "a", m.Task)  # the round's one slot
    for i in range(500):
        cid = f"h{i}"
        assert not sent(core.connect(cid, hello(cid), 1.0), cid, m.Task)
        core.disconnect(cid, 1.0, "gone")
    assert core.registry.known() == 1  # a, connected


def test_a_client_among_the_last_max_resumable_to_leave_resumes_and_delivers() -> None:
    core = flood_core()
    t = flood(core, 1000, 0.0, prefix="h")
    welcome, task = sent(core.connect("a", hello("a"), t), "a")[:2]
    assert isinstance(task, m.Task)
    core.disconnect("a", t + 0.5, "network")
    t = flood(core, CAP - 1, t + 0.5, prefix="k")  # a is still among the last CAP
    out = core.connect("a2", hello("a", resume=welcome.resume_token), t)
    assert only(out, ev.ClientJoined)[0].resumed
    out = deliver(core, "a2", result_messages(task), t + 0.1)
    assert (task.task_id, True, "") in acks(out, "a2")
    assert core.model.contributions == 1


def test_past_max_resumable_the_first_to_leave_is_forgotten_and_its_result_is_stale() -> None:
    core = flood_core()
    welcome, task = sent(core.connect("a", hello("a"), 0.0), "a")[:2]
    core.disconnect("a", 0.5, "network")
    t = flood(core, CAP, 1.0, prefix="h")  # CAP left after a: its record and task go
    assert int(task.task_id) not in core.book.tasks
    out = core.connect("a2", hello("a", resume=welcome.resume_token), t)
    assert not only(out, ev.ClientJoined)[0].resumed
    out = deliver(core, "a2", result_messages(task), t + 0.1)
    assert (task.task_id, False, "stale") in acks(out, "a2")
    assert core.model.contributions == 0


def test_hostile_frames_leave_state_bounded_beside_an_honest_client() -> None:
    core = make_core(stop=OPEN_ENDED, lease={"max_resumable": CAP})
    report = fuzz(core, 4000, seed=7, every=50)
    assert report.crashes == [] and report.connections > 3000
    assert report.honest_accepted > 300
    r = retained(core)
    # the honest client's current and queued tasks, the last CAP hostile clients' tasks
    assert r["records"] <= CAP + 1 and r["tasks"] <= 2 * CAP + 2 and r["leases"] <= r["tasks"]
    assert r["outcomes"] == report.honest_accepted  # accepted results only


def test_a_flood_keeps_few_strangers_and_a_volunteer_with_accepted_results_resumes() -> None:
    """``max_resumable_unproven``: strangers who took a task and vanished keep at
    most that many records; a volunteer whose results were accepted keeps its own
    and resumes after the flood."""
    core = flood_core(max_resumable_unproven=5)
    welcome, task = sent(core.connect("v", hello("v"), 0.0), "v")[:2]
    out = deliver(core, "v", result_messages(task), 0.1)
    assert (task.task_id, True, "") in acks(out, "v")
    follow = [msg for msg in sent(out, "v") if isinstance(msg, m.Task)]
    core.disconnect("v", 0.5, "network")
    t = flood(core, 1000, 1.0, prefix="h")
    # the flood's 1,000 held tasks went with their forgotten holders, not by the cap
    # of 80, so the volunteer's is still held for it
    assert retained(core)["records"] == retained(core)["tasks"] == 5 + 1
    out = core.connect("v2", hello("v", resume=welcome.resume_token), t)
    assert only(out, ev.ClientJoined)[0].resumed
    assert len(follow) == 1
    out = deliver(core, "v2", result_messages(follow[0]), t + 0.1)
    assert (follow[0].task_id, True, "") in acks(out, "v2")
