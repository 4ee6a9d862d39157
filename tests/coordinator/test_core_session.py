"""Session-level rules of the core (docs/protocol.md §3.9, §3.13, §6): version
negotiation, ``decline``, and the end of a job. Event scripts with an injected
``now``; no sockets, no sleeps."""

from __future__ import annotations

import pytest

from coordinator.core import events as ev
from coordinator.core.config import JobConfigError
from coordinator.core.connections import DECLINE_BACKOFF_MAX_S, DECLINE_BACKOFF_S
from coordinator.core.leases import LeaseState
from protocol import messages as m
from protocol.errors import CLOSE_NORMAL, ErrorCode, close_code
from protocol.limits import LinkLimits
from tests.coordinator.coord_helpers import (
    acks,
    deliver,
    hello,
    make_core,
    make_job,
    only,
    result_messages,
    sent,
    task_of,
)

# -- version negotiation (§6, §9) ---------------------------------------------------------


def test_a_hello_offering_a_newer_version_is_welcomed_at_ours() -> None:
    core = make_core()
    out = core.connect("a", hello("a", version=2), 0.0)
    (welcome,) = sent(out, "a", m.Welcome)
    assert welcome.version == m.choose_version(2) == 1
    assert task_of(out, "a").task_id  # and served like any client


def test_a_hello_offering_only_older_versions_is_refused_4004() -> None:
    core = make_core()
    out = core.connect("a", hello("a", version=0), 0.0)
    (err,) = sent(out, "a", m.Error)
    assert err.code == ErrorCode.UNSUPPORTED_VERSION and "hello.version" in err.message
    assert only(out, ev.Close)[0].code == close_code(ErrorCode.UNSUPPORTED_VERSION) == 4004
    assert "a" not in core.conns


# -- 64-bit fields stay exact in JavaScript (§1) ------------------------------------------


def test_every_int_a_task_carries_fits_a_javascript_number() -> None:
    core = make_core(stop={"max_versions": 50})
    task = task_of(core.connect("a", hello("a"), 0.0), "a")
    for i in range(20):
        assert 0 <= task.seed <= m.MAX_SAFE_INT and task.model_version <= m.MAX_SAFE_INT
        task = task_of(deliver(core, "a", result_messages(task), 1.0 + i), "a")
    assert make_job(model={"init_seed": m.MAX_SAFE_INT}).model.init_seed == m.MAX_SAFE_INT
    with pytest.raises(JobConfigError, match="init_seed"):
        make_job(model={"init_seed": m.MAX_SAFE_INT + 1})


# -- decline (§3.13) -----------------------------------------------------------------------


def test_welcome_offers_decline() -> None:
    core = make_core()
    assert sent(core.connect("a", hello("a"), 0.0), "a", m.Welcome)[0].decline


def test_a_declined_sync_task_goes_to_another_client_at_once() -> None:
    core = make_core("decentral-sync", strategy={"clients_per_round": 1})
    t_a = task_of(core.connect("a", hello("a"), 0.0), "a")
    assert sent(core.connect("b", hello("b"), 0.5), "b", m.Task) == []  # the slot is a's
    out = core.receive("a", m.Decline(task_id=t_a.task_id, reason="memory: MemoryError"), 1.0)
    (dec,) = only(out, ev.TaskDeclined)
    assert dec.client_id == "a" and dec.task_id == int(t_a.task_id)
    assert dec.reason == "memory: MemoryError" and dec.reissued
    assert core.book.leases[dec.lease_id].state is LeaseState.DECLINED
    t_b = task_of(out, "b")  # long before a's 10 s lease would have expired
    assert (t_b.task_id, t_b.seed, t_b.shard) == (t_a.task_id, t_a.seed, t_a.shard)
    assert sent(out, "a", m.Task) == []
    rec = core.registry.get("a")
    assert rec is not None and rec.declined == 1 and rec.declined_in_row == 1


def test_a_declined_async_task_is_dropped_and_its_shard_revisited_by_another() -> None:
    core = make_core()
    t_a = task_of(core.connect("a", hello("a"), 0.0), "a")
    t_b = task_of(core.connect("b", hello("b"), 0.0), "b")
    out = core.receive("a", m.Decline(task_id=t_a.task_id, reason="compute"), 1.0)
    assert not only(out, ev.TaskDeclined)[0].reissued
    assert core.book.outcome(int(t_a.task_id)) is None  # dropped: no resume grace
    assert sent(out, "a", m.Task) == []  # a cools down
    out = deliver(core, "b", result_messages(t_b), 1.2)
    assert task_of(out, "b").shard == t_a.shard  # b, idle first, takes a's shard


def test_a_client_that_declines_everything_backs_off_instead_of_spinning() -> None:
    core = make_core(lease={"heartbeat_timeout_s": 1e6})
    task = task_of(core.connect("a", hello("a"), 0.0), "a")
    now, waits = 1.0, []
    for _ in range(8):
        out = core.receive("a", m.Decline(task_id=task.task_id, reason="compute"), now)
        assert sent(out, "a", m.Task) == []
        wake = core.next_wakeup()
        assert wake is not None and wake > now
        assert sent(core.tick(wake - 1e-6), "a", m.Task) == []  # not a moment early
        waits.append(wake - now)
        now = wake
        task = task_of(core.tick(now), "a")
        assert task.num_chunks > 0  # after a decline the server assumes no model held
    b = DECLINE_BACKOFF_S
    assert waits == pytest.approx([b, 2 * b, 4 * b, 8 * b, 16 * b, 32 * b, 60.0, 60.0])
    assert DECLINE_BACKOFF_MAX_S == 60.0
    # an accepted result resets the back-off
    nxt = task_of(deliver(core, "a", result_messages(task), now + 1.0), "a")
    core.receive("a", m.Decline(task_id=nxt.task_id, reason="compute"), now + 2.0)
    assert core.next_wakeup() == pytest.approx(now + 2.0 + DECLINE_BACKOFF_S)


def test_a_decline_of_a_task_not_leased_to_the_client_is_ignored() -> None:
    core = make_core()
    t_a = task_of(core.connect("a", hello("a"), 0.0), "a")
    t_b = task_of(core.connect("b", hello("b"), 0.0), "b")
    for tid in (t_b.task_id, "999", "not-a-number"):
        out = core.receive("a", m.Decline(task_id=tid, reason="compute"), 1.0)
        assert out == [] or not only(out, ev.TaskDeclined)
        assert not only(out, ev.Close)
    assert core.book.live_lease_of("a").task_id == int(t_a.task_id)
    # and after a result for it, a decline of the same task does nothing either
    deliver(core, "a", result_messages(t_a), 2.0)
    out = core.receive("a", m.Decline(task_id=t_a.task_id), 2.5)
    assert not only(out, ev.TaskDeclined)


def test_declining_the_running_task_promotes_the_queued_one() -> None:
    core = make_core(lease={"prefetch": True})
    first = task_of(core.connect("a", hello("a"), 0.0), "a")
    nxt = task_of(core.receive("a", m.Prefetch(task_id=first.task_id), 0.5), "a")
    out = core.receive("a", m.Decline(task_id=first.task_id, reason="compute"), 1.0)
    assert only(out, ev.TaskDeclined)[0].task_id == int(first.task_id)
    assert core.book.live_lease_of("a").task_id == int(nxt.task_id)
    assert core.book.queued_lease_of("a") is None
    out = deliver(core, "a", result_messages(nxt), 2.0)
    assert acks(out, "a") == [(nxt.task_id, True, "")]


def test_declining_the_queued_task_keeps_the_running_one() -> None:
    core = make_core(lease={"prefetch": True})
    first = task_of(core.connect("a", hello("a"), 0.0), "a")
    nxt = task_of(core.receive("a", m.Prefetch(task_id=first.task_id), 0.5), "a")
    out = core.receive("a", m.Decline(task_id=nxt.task_id, reason="model"), 1.0)
    assert only(out, ev.TaskDeclined)[0].task_id == int(nxt.task_id)
    assert core.book.live_lease_of("a").task_id == int(first.task_id)
    assert core.book.queued_lease_of("a") is None
    out = deliver(core, "a", result_messages(first), 2.0)
    assert acks(out, "a") == [(first.task_id, True, "")]


# -- the end of a job (§3.9) -----------------------------------------------------------------


def test_every_accepted_result_is_acked_before_the_bye_even_behind_pacing() -> None:
    """The ack of the result that ends the job waits behind a paced frame (here a
    heartbeat echo on a one-message-per-second link); it still goes before bye."""
    slow = LinkLimits(bytes_per_s=1e6, messages_per_s=1.0, max_message_bytes=1 << 20)
    core = make_core(stop={"max_versions": 1})
    out = core.connect("a", hello("a", limits=slow), 0.0)
    now = 0.0
    while not sent(out, "a", m.Task):
        now = core.next_wakeup()
        out = core.tick(now)
    task = task_of(out, "a")
    now += 30.0  # the bucket is full again: one message
    core.receive("a", m.Heartbeat(seq=1, time=now), now)  # its echo takes it
    out = deliver(core, "a", result_messages(task), now)
    assert only(out, ev.JobFinished)
    frames = [type(x) for x in sent(out, "a") if not isinstance(x, m.Heartbeat)]
    assert frames == [m.Ack, m.Bye]
    assert acks(out, "a") == [(task.task_id, True, "")]
    assert sent(out, "a", m.Bye)[0] == m.Bye(reason="finished", detail="max_versions")
    (close,) = only(out, ev.Close)
    assert close.code == CLOSE_NORMAL and out.index(close) > out.index(
        next(o for o in out if isinstance(o, ev.Send) and isinstance(o.message, m.Bye))
    )


def test_a_result_still_uploading_when_the_job_ends_is_acked_stale_before_the_bye() -> None:
    """Issue 34: docs/protocol.md §6 answers every result not taken; one whose
    chunks were still coming when another client's result ended the job got none."""
    core = make_core(stop={"max_versions": 1})
    t_a = task_of(core.connect("a", hello("a"), 0.0), "a")
    t_b = task_of(core.connect("b", hello("b"), 0.0), "b")
    header, *chunks = result_messages(t_b, spans=False)
    assert chunks  # b's header is in, its chunks are not
    core.receive("b", header, 0.1)
    out = deliver(core, "a", result_messages(t_a), 0.2)
    assert only(out, ev.JobFinished)
    assert acks(out, "b") == [(t_b.task_id, False, "stale")]
    frames = [type(x) for x in sent(out, "b") if isinstance(x, m.Ack | m.Bye)]
    assert frames == [m.Ack, m.Bye]


def test_the_bye_goes_to_every_client_and_queued_tasks_are_not_sent() -> None:
    slow = LinkLimits(bytes_per_s=1e6, messages_per_s=1.0, max_message_bytes=1 << 20)
    core = make_core(stop={"max_versions": 1})
    t_a = task_of(core.connect("a", hello("a"), 0.0), "a")
    core.connect("b", hello("b", limits=slow), 0.0)  # b's task is still queued
    out = deliver(core, "a", result_messages(t_a), 0.1)
    assert sent(out, "b", m.Task) == [] and sent(out, "b", m.Chunk) == []
    for cid in ("a", "b"):
        assert [b.finished for b in sent(out, cid, m.Bye)] == [True]
    assert {c.client_id for c in only(out, ev.Close)} == {"a", "b"}
    assert core.conns == {}
