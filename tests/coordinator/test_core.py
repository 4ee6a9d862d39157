"""Scripted scenarios: events in, actions out; no sockets, no sleeps."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from coordinator.core import events as ev
from coordinator.core.assembly import build_core, restore_core
from coordinator.core.earlystop import ends_again
from coordinator.core.leases import LeaseState, TaskState
from nn.spec import INIT_SCHEME
from protocol import messages as m
from protocol.checksum import crc32
from protocol.errors import CLOSE_NORMAL, ErrorCode, close_code
from tests.coordinator.coord_helpers import (
    acks,
    deliver,
    digits,
    hello,
    make_core,
    make_job,
    only,
    result_messages,
    sent,
    task_of,
)


def test_core_and_session_load_no_io_at_run_time() -> None:
    """The static rule is import-linter's (tests/test_layers.py); this checks what
    importing them actually loads, external packages' own imports included."""
    code = (
        "import sys, coordinator.core.machine, client.session\n"
        "io = {'asyncio', 'websockets', 'uvicorn', 'fastapi', 'sqlite3'}\n"
        "print(sorted(io & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_join_gets_welcome_then_task_with_model_chunks() -> None:
    core = make_core()
    out = core.connect("a", hello("alice"), 0.0)
    msgs = sent(out, "a")
    assert isinstance(msgs[0], m.Welcome)
    assert msgs[0].resume_token
    task = msgs[1]
    assert isinstance(task, m.Task) and task.kind == "train" and task.steps == 2
    assert task.base_version is None and task.num_chunks == len(msgs) - 2
    assert all(isinstance(c, m.Chunk) and c.transfer == task.model_transfer for c in msgs[2:])
    assert task.indices is not None and set(task.indices) <= set(range(len(digits().y_train)))
    joined = only(out, ev.ClientJoined)
    assert joined == [ev.ClientJoined(client_id="a", name="alice", resumed=False, now=0.0)]
    assert only(out, ev.TaskLeased)[0].deadline >= 10.0


def test_result_is_applied_once_and_duplicate_acknowledged() -> None:
    core = make_core()
    task = task_of(core.connect("a", hello("a"), 0.0), "a")
    before = core.params.data.copy()
    update = np.full(core.params.num_params, 0.01, np.float32)
    out = deliver(core, "a", result_messages(task, update), 1.0)
    assert acks(out, "a") == [(task.task_id, True, "")]
    assert core.version == 1 and core.model.contributions == 1
    alpha = core.job.strategy.alpha * 1.0  # staleness 0 -> scale 1
    np.testing.assert_allclose(core.params.data, before + np.float32(alpha) * update, rtol=1e-6)
    assert only(out, ev.ModelUpdated)[0].version == 1
    # the client got its next task, at the new version
    assert task_of(out, "a").model_version == 1
    # the same result again: acknowledged, not applied
    snapshot = core.params.data.copy()
    out = deliver(core, "a", result_messages(task, update), 2.0)
    assert acks(out, "a") == [(task.task_id, False, "duplicate")]
    assert core.version == 1 and core.model.contributions == 1
    assert np.array_equal(core.params.data, snapshot)


def test_disconnect_mid_task_then_resume_delivers_result() -> None:
    core = make_core()
    welcome, task = sent(core.connect("a", hello("a"), 0.0), "a")[:2]
    out = core.disconnect("a", 1.0, "network")
    assert only(out, ev.ClientLeft)[0].client_id == "a"
    lease = core.book.leases[1]
    assert lease.state is LeaseState.LOST
    assert core.book.outcome(int(task.task_id)) is TaskState.OPEN  # resume grace
    out = core.connect("a2", hello("a", resume=welcome.resume_token), 5.0)
    assert only(out, ev.ClientJoined)[0].resumed
    assert sent(out, "a2", m.Welcome)[0].resume_token == welcome.resume_token
    out = deliver(core, "a2", result_messages(task), 6.0)
    assert (task.task_id, True, "") in acks(out, "a2")
    assert core.model.contributions == 1


def test_orphaned_task_is_dropped_after_resume_grace() -> None:
    core = make_core(lease={"resume_grace_s": 30.0})
    welcome, task = sent(core.connect("a", hello("a"), 0.0), "a")[:2]
    core.disconnect("a", 1.0)
    core.tick(40.0)
    assert core.book.outcome(int(task.task_id)) is None  # dropped: a late result is stale
    core.connect("b", hello("a", resume=welcome.resume_token), 41.0)
    out = deliver(core, "b", result_messages(task), 42.0)
    assert (task.task_id, False, "stale") in acks(out, "b")
    assert core.model.contributions == 0


def test_unknown_resume_token_starts_fresh() -> None:
    core = make_core()
    out = core.connect("a", hello("a", resume="nope"), 0.0)
    assert not only(out, ev.ClientJoined)[0].resumed
    assert sent(out, "a", m.Welcome)[0].resume_token != "nope"


def test_a_resume_while_the_old_connection_is_open_takes_the_session_over() -> None:
    """A client whose network changed reconnects before its old connection's end
    reaches the server: the resume takes the session (record, lease) and the old
    connection is closed REPLACED, instead of the client starting afresh."""
    core = make_core()
    welcome, task = sent(core.connect("a", hello("a"), 0.0), "a")[:2]
    core.connect("b", hello("b"), 0.5)
    out = core.connect("a2", hello("a", resume=welcome.resume_token), 1.0)
    assert [x.code for x in sent(out, "a", m.Error)] == [ErrorCode.REPLACED]
    assert only(out, ev.Close) == [
        ev.Close(client_id="a", code=4018, reason="a newer connection resumed this session")
    ]
    assert only(out, ev.ClientLeft)[0].client_id == "a"
    assert only(out, ev.ClientJoined)[0].resumed
    assert sent(out, "a2", m.Welcome)[0].resume_token == welcome.resume_token
    assert sorted(core.conns) == ["a2", "b"]  # b, another client, is untouched
    # the task a held is still its to deliver, now over the new connection
    out = deliver(core, "a2", result_messages(task), 2.0)
    assert (task.task_id, True, "") in acks(out, "a2")
    assert core.model.contributions == 1
    # a token nobody was handed takes nothing over
    out = core.connect("x", hello("x", resume="0" * 24), 3.0)
    assert not only(out, ev.ClientJoined)[0].resumed and only(out, ev.Close) == []


def test_with_a_session_key_resume_tokens_are_unguessable() -> None:
    """A served coordinator's tokens come from a per-process secret: not from the
    job seed a stranger may know, and never one an earlier run handed out."""
    seeded = [make_core(seed=3) for _ in range(2)]
    keyed = [
        build_core(make_job(), seed=3, dataset=digits(), session_key=bytes([k]) * 32)
        for k in (1, 2)
    ]
    tokens = [
        sent(c.connect("a", hello("a"), 0.0), "a", m.Welcome)[0].resume_token
        for c in (*seeded, *keyed)
    ]
    assert tokens[0] == tokens[1]  # seeded: a simulation is reproducible
    assert len({tokens[0], tokens[2], tokens[3]}) == 3


def test_sync_lease_expiry_reissues_and_first_result_wins() -> None:
    core = make_core("decentral-sync", strategy={"clients_per_round": 1})
    t_a = task_of(core.connect("a", hello("a"), 0.0), "a")
    out = core.connect("b", hello("b"), 1.0)
    assert sent(out, "b", m.Task) == []  # the round's single slot is taken
    out = core.tick(11.0)  # a's lease (10 s) expired: reissued to idle b
    expired = only(out, ev.LeaseExpired)
    assert len(expired) == 1 and expired[0].reissued and expired[0].client_id == "a"
    t_b = task_of(out, "b")
    assert t_b.task_id == t_a.task_id and t_b.seed == t_a.seed and t_b.shard == t_a.shard
    # a (the straggler) answers first: taken; b's copy is then a duplicate
    out = deliver(core, "a", result_messages(t_a), 12.0)
    assert (t_a.task_id, True, "") in acks(out, "a")
    assert core.version == 1
    assert core.book.live_lease_of("b") is None  # b's lease was cancelled
    assert 2 not in core.book.leases  # and left the book with its resolved task
    out = deliver(core, "b", result_messages(t_b), 13.0)
    assert (t_b.task_id, False, "duplicate") in acks(out, "b")
    assert core.version == 1 and core.model.contributions == 1


def test_sync_round_closes_at_deadline_with_quorum_and_drops_straggler() -> None:
    core = make_core(
        "central-sync", strategy={"clients_per_round": 3, "quorum": 0.6, "round_deadline_s": 5.0}
    )
    tasks = {c: task_of(core.connect(c, hello(c), 0.0), c) for c in "abc"}
    assert all(t.kind == "gradient" and t.model_version == 0 for t in tasks.values())
    deliver(core, "a", result_messages(tasks["a"]), 1.0)
    deliver(core, "b", result_messages(tasks["b"]), 2.0)
    assert core.version == 0  # 2 of 3, before the deadline: keep waiting
    out = core.tick(5.0)
    assert core.version == 1 and core.model.contributions == 2
    assert only(out, ev.ModelUpdated)[0].contributions == 2
    assert core.book.outcome(int(tasks["c"].task_id)) is None  # dropped
    out = deliver(core, "c", result_messages(tasks["c"]), 6.0)
    assert (tasks["c"].task_id, False, "stale") in acks(out, "c")
    assert core.model.contributions == 2


def test_sync_round_below_quorum_replicates_unfinished_work() -> None:
    core = make_core(
        "decentral-sync",
        strategy={"clients_per_round": 2, "quorum": 1.0, "round_deadline_s": 5.0},
        lease={"min_s": 100.0},
    )
    t_a = task_of(core.connect("a", hello("a"), 0.0), "a")
    t_b = task_of(core.connect("b", hello("b"), 0.0), "b")
    deliver(core, "a", result_messages(t_a), 1.0)  # a is idle again, round needs b
    out = core.tick(5.0)  # deadline below quorum: b's task is copied to idle a
    assert core.version == 0
    copy = task_of(out, "a")
    assert copy.task_id == t_b.task_id
    out = deliver(core, "a", result_messages(copy), 7.0)
    assert core.version == 1 and core.model.contributions == 2


def test_nonfinite_update_rejected_and_client_closed_over_threshold() -> None:
    core = make_core(validation={"max_rejections": 2})
    task = task_of(core.connect("a", hello("a"), 0.0), "a")
    bad = np.full(core.params.num_params, np.nan, np.float32)
    out = deliver(core, "a", result_messages(task, bad), 1.0)
    assert acks(out, "a") == [(task.task_id, False, "nonfinite")]
    assert only(out, ev.ResultRejected)[0].reason == "nonfinite"
    assert core.version == 0 and core.params.is_finite()
    task2 = task_of(out, "a")  # a rejected update frees the client for new work
    out = deliver(core, "a", result_messages(task2, bad), 2.0)
    closes = only(out, ev.Close)
    assert closes and closes[0].code == close_code(ErrorCode.BAD_FIELD)
    assert "a" not in core.conns


def test_norm_outlier_rejected_after_warmup() -> None:
    core = make_core(validation={"norm_warmup": 2, "norm_multiple": 5.0})
    small = np.full(core.params.num_params, 1e-3, np.float32)
    task = task_of(core.connect("a", hello("a"), 0.0), "a")
    for i in range(2):
        out = deliver(core, "a", result_messages(task, small), 1.0 + i)
        task = task_of(out, "a")
    out = deliver(core, "a", result_messages(task, small * 100), 5.0)
    assert acks(out, "a") == [(task.task_id, False, "norm")]
    assert core.model.contributions == 2


def test_wrong_model_version_is_rejected() -> None:
    core = make_core()
    task = task_of(core.connect("a", hello("a"), 0.0), "a")
    out = deliver(core, "a", result_messages(task, version=7), 1.0)
    assert acks(out, "a") == [(task.task_id, False, "version")]


def test_unexpected_message_closes_with_code() -> None:
    core = make_core()
    core.connect("a", hello("a"), 0.0)
    out = core.receive("a", hello("a"), 1.0)
    err = sent(out, "a", m.Error)[0]
    assert err.code == ErrorCode.UNEXPECTED
    assert only(out, ev.Close)[0].code == close_code(ErrorCode.UNEXPECTED)
    assert core.disconnect("a", 2.0) == []  # already closed by the core
    with pytest.raises(ValueError, match="not connected"):
        core.receive("a", m.Heartbeat(seq=1), 3.0)


def test_chunk_without_result_closes() -> None:
    core = make_core()
    task = task_of(core.connect("a", hello("a"), 0.0), "a")
    chunk = result_messages(task)[1]
    out = core.receive("a", chunk, 1.0)
    assert sent(out, "a", m.Error)[0].code == ErrorCode.UNKNOWN_TASK


def test_heartbeat_echo_and_timeout() -> None:
    core = make_core(lease={"heartbeat_interval_s": 2.0, "heartbeat_timeout_s": 6.0})
    core.connect("a", hello("a"), 0.0)
    out = core.receive("a", m.Heartbeat(seq=3, time=123.0), 4.0)
    hb = sent(out, "a", m.Heartbeat)[0]
    assert hb.seq == 3 and hb.echo == 123.0
    out = core.tick(9.0)  # 5 s silent, the timeout is 6 s: still there
    assert "a" in core.conns and not sent(out, "a", m.Error)
    out = core.tick(10.5)
    assert sent(out, "a", m.Error)[0].code == ErrorCode.TIMEOUT
    assert only(out, ev.ClientLeft)[0].client_id == "a"
    assert core.book.all_resolved()


def test_a_driver_that_echoes_heartbeats_itself_gets_no_echo_but_liveness_counts() -> None:
    core = make_core(lease={"heartbeat_interval_s": 2.0, "heartbeat_timeout_s": 6.0})
    core.echo_heartbeats = False
    core.connect("a", hello("a"), 0.0)
    assert sent(core.receive("a", m.Heartbeat(seq=1, time=1.0), 4.0), "a", m.Heartbeat) == []
    assert not sent(core.tick(9.5), "a", m.Error)  # seen at 4.0: not late before 10.0
    assert sent(core.tick(10.5), "a", m.Error)[0].code == ErrorCode.TIMEOUT


def test_rate_limit_violation_closes() -> None:
    core = make_core(link={"profile": "roblox"})
    core.connect("a", hello("a"), 0.0)
    out: list[ev.Output] = []
    for i in range(200):
        out += core.receive("a", m.Heartbeat(seq=i), 0.01, nbytes=30)
        if only(out, ev.Close):
            break
    assert only(out, ev.Close)[0].code == close_code(ErrorCode.RATE_LIMITED)


def test_model_download_is_paced_to_link_limits() -> None:
    job = make_job(model={"widths": [64, 256, 10]}, link={"profile": "roblox"})
    core = build_core(job, seed=0, dataset=digits())
    out = core.connect("a", hello("a"), 0.0)
    first = sum(len(o.frame) for o in out if isinstance(o, ev.Send))
    total_needed = core.job.spec.nbytes
    assert first < total_needed  # not everything at once on a 50 kB/s link
    t, times = 0.0, []
    while core.conns["a"].outbox:
        wake = core.next_wakeup()
        assert wake is not None and wake > t
        t = wake
        for o in core.tick(t):
            if isinstance(o, ev.Send):
                times.append((t, len(o.frame)))
    sent_bytes = first + sum(n for _, n in times)
    assert sent_bytes > total_needed
    # the pacer's bound: rate * T + burst (1 s of rate) over the whole transfer
    limits = core.conns["a"].limits
    assert sent_bytes <= limits.bytes_per_s * t + max(limits.burst_bytes, limits.max_message_bytes)
    assert t >= (sent_bytes - limits.burst_bytes) / limits.bytes_per_s - 1e-6


def test_second_task_in_round_reuses_cached_model() -> None:
    core = make_core("decentral-sync", strategy={"clients_per_round": 2})
    t1 = task_of(core.connect("a", hello("a"), 0.0), "a")
    assert t1.base_version is None
    out = deliver(core, "a", result_messages(t1), 1.0)
    t2 = task_of(out, "a")
    assert t2.base_version == 0 and t2.num_chunks == 0 and t2.task_id != t1.task_id


def test_central_async_staleness_bound() -> None:
    core = make_core("central-async", strategy={"max_staleness": 0})
    t_a = task_of(core.connect("a", hello("a"), 0.0), "a")
    t_b = task_of(core.connect("b", hello("b"), 0.0), "b")
    deliver(core, "a", result_messages(t_a), 1.0)
    out = deliver(core, "b", result_messages(t_b), 2.0)
    assert (t_b.task_id, False, "stale") in acks(out, "b")
    assert core.version == 1


def test_fedbuff_steps_every_k_results() -> None:
    core = make_core(strategy={"aggregation": "fedbuff", "buffer_k": 2})
    t_a = task_of(core.connect("a", hello("a"), 0.0), "a")
    t_b = task_of(core.connect("b", hello("b"), 0.0), "b")
    deliver(core, "a", result_messages(t_a), 1.0)
    assert core.version == 0 and core.strategy.pending() == 1
    deliver(core, "b", result_messages(t_b), 2.0)
    assert core.version == 1 and core.model.contributions == 2 and core.strategy.pending() == 0


def test_checkpoints_stop_and_restore() -> None:
    core = make_core(checkpoint={"every_versions": 2}, stop={"max_versions": 4})
    task = task_of(core.connect("a", hello("a"), 0.0), "a")
    outs: list[ev.Output] = []
    for i in range(4):
        out = deliver(core, "a", result_messages(task), 1.0 + i)
        outs += out
        if core.finished is None:
            task = task_of(out, "a")
    assert [c.version for c in only(outs, ev.Checkpoint)] == [2, 4, 4]
    fin = only(outs, ev.JobFinished)[0]
    assert fin.reason == "max_versions" and fin.version == 4 and fin.accuracy is not None
    (bye,) = sent(outs, "a", m.Bye)
    assert bye.finished and bye.detail == "max_versions"
    assert only(outs, ev.Close)[-1].code == CLOSE_NORMAL
    # A client that missed the bye and comes back learns the job is over.
    refused = core.connect("b", hello("b"), 10.0)
    assert [b.finished for b in sent(refused, "b", m.Bye)] == [True]
    assert only(refused, ev.Close)[-1].code == CLOSE_NORMAL
    state = core.state_dict()
    # Restarted from that checkpoint, the run is over at once: its first client
    # learns so, and no version past max_versions is trained.
    again = restore_core(core.job, state, seed=0, dataset=digits())
    assert again.version == 4 and again.params.array_equal(core.params)
    out = again.connect("c", hello("c"), 0.0)
    (fin,) = only(out, ev.JobFinished)
    assert (fin.reason, fin.version) == ("max_versions", 4)
    assert [b.finished for b in sent(out, "c", m.Bye)] == [True] and not sent(out, "c", m.Task)
    assert again.version == 4
    # Restored under a raised max_versions it trains on: ids never reused, and a
    # result resent for a task taken before the checkpoint is a duplicate.
    more = restore_core(make_job(stop={"max_versions": 8}), state, seed=0, dataset=digits())
    more.tick(0.0)
    assert more.finished is None
    t2 = task_of(more.connect("c", hello("c"), 0.0), "c")
    assert int(t2.task_id) > int(task.task_id)
    out = deliver(more, "c", result_messages(task), 1.0)
    assert (task.task_id, False, "duplicate") in acks(out, "c")


def test_a_restored_run_at_max_versions_ends_at_its_first_tick() -> None:
    core = make_core(stop={"max_versions": 1})
    task = task_of(core.connect("a", hello("a"), 0.0), "a")
    deliver(core, "a", result_messages(task), 1.0)
    assert core.finished is not None
    again = restore_core(core.job, core.state_dict(), seed=0, dataset=digits())
    out = again.tick(5.0)
    (fin,) = only(out, ev.JobFinished)
    assert (fin.reason, fin.version, again.version) == ("max_versions", 1, 1)
    assert fin.accuracy is not None  # evaluated at the end, as any finish is
    assert not only(again.tick(6.0), ev.JobFinished)  # once


def test_a_restored_run_that_reached_its_target_ends_again_unless_the_target_is_raised() -> None:
    """The checkpoint says why the run ended; restarted under the same stop it ends
    at once (no volunteer trains a finished job), under a lifted one it trains on."""
    stop = {"target_accuracy": 0.01, "patience": 0}
    core = make_core(stop=stop, eval={"every_versions": 1, "max_samples": 64})
    task = task_of(core.connect("a", hello("a"), 0.0), "a")
    deliver(core, "a", result_messages(task), 1.0)
    assert core.finished is not None and core.finished.reason == "target_accuracy"
    state = core.state_dict()
    assert state["finished"]["reason"] == "target_accuracy"
    again = restore_core(core.job, state, seed=0, dataset=digits())
    out = again.connect("c", hello("c"), 0.0)
    (fin,) = only(out, ev.JobFinished)
    assert (fin.reason, fin.version) == ("target_accuracy", core.version)
    assert not sent(out, "c", m.Task) and [b.finished for b in sent(out, "c", m.Bye)] == [True]
    # The same state, a target above what was reached: the run trains on.
    raised = make_job(stop={"target_accuracy": 0.999, "patience": 0})
    more = restore_core(raised, state, seed=0, dataset=digits())
    assert task_of(more.connect("c", hello("c"), 0.0), "c") is not None
    assert more.finished is None


def test_a_restored_run_that_ran_out_of_time_ends_again_unless_given_more() -> None:
    core = make_core(stop={"max_time_s": 5.0})
    task_of(core.connect("a", hello("a"), 0.0), "a")
    (fin,) = only(core.tick(5.0), ev.JobFinished)
    assert fin.reason == "max_time"
    state = core.state_dict()
    again = restore_core(core.job, state, seed=0, dataset=digits())
    assert only(again.tick(100.0), ev.JobFinished)[0].reason == "max_time"
    longer = restore_core(make_job(stop={"max_time_s": 50.0}), state, seed=0, dataset=digits())
    assert not only(longer.tick(100.0), ev.JobFinished)
    task_of(longer.connect("c", hello("c"), 100.0), "c")  # counted again from this start
    assert not only(longer.tick(149.0), ev.JobFinished)
    assert only(longer.tick(150.0), ev.JobFinished)[0].reason == "max_time"


@pytest.mark.parametrize(
    ("stop", "ended", "expect"),
    [
        ({"patience": 40}, {"reason": "converged", "limit": 40}, "converged"),
        ({"patience": 20}, {"reason": "converged", "limit": 40}, "converged"),
        ({"patience": 80}, {"reason": "converged", "limit": 40}, None),
        ({"patience": 0}, {"reason": "converged", "limit": 40}, None),
        (
            {"target_accuracy": 0.9},
            {"reason": "target_accuracy", "accuracy": 0.93},
            "target_accuracy",
        ),
        ({"target_accuracy": 0.95}, {"reason": "target_accuracy", "accuracy": 0.93}, None),
        ({}, {"reason": "target_accuracy", "accuracy": 0.93}, None),
        ({"max_time_s": 60.0}, {"reason": "max_time", "limit": 60.0}, "max_time"),
        ({}, {"reason": "max_time", "limit": 60.0}, None),
        ({"max_versions": 9}, None, "max_versions"),
        ({"max_versions": 11}, {"reason": "max_versions", "limit": 9}, None),
        ({}, None, None),
    ],
)
def test_ends_again_holds_while_the_stop_that_ended_the_run_does(
    stop: dict, ended: dict | None, expect: str | None
) -> None:
    assert ends_again(make_job(stop=stop).stop, 10, ended) == expect


def test_a_result_for_a_task_issued_after_the_last_checkpoint_is_stale_after_a_crash() -> None:
    """A crash loses the tasks issued after the checkpoint; their ids must not come
    back as new tasks, or a client's resent result would be refused ``version``
    (counted: a few crashes closed honest clients, tests/e2e/test_crash_durability)."""
    core = make_core()
    first = task_of(core.connect("a", hello("a"), 0.0), "a")
    state = core.state_dict()  # the checkpoint
    out = deliver(core, "a", result_messages(first), 1.0)  # ...then more work, then a crash
    lost = task_of(out, "a")
    again = restore_core(core.job, state, seed=0, dataset=digits())
    fresh = task_of(again.connect("a2", hello("a2"), 2.0), "a2")
    assert int(fresh.task_id) != int(lost.task_id)
    out = deliver(again, "a2", result_messages(lost), 3.0)
    assert (lost.task_id, False, "stale") in acks(out, "a2")
    assert not only(out, ev.ResultRejected) or all(
        r.reason == "stale" for r in only(out, ev.ResultRejected)
    )
    assert again.registry.get("a2").rejections == 0


def test_time_going_backwards_is_the_callers_bug() -> None:
    core = make_core()
    core.tick(5.0)
    with pytest.raises(ValueError, match="backwards"):
        core.tick(4.0)


def _checked(msg: m.Message) -> m.Message:
    """The same message through the per-field checks."""
    return type(msg)(**{name: getattr(msg, name) for name, *_ in msg._PLAN})


def test_tasks_and_acks_the_core_builds_unchecked_equal_the_checked_ones() -> None:
    core = make_core(validation={"max_rejections": 9})
    out = core.connect("a", hello("a"), 0.0)
    task = task_of(out, "a")
    update = np.full(core.params.num_params, 0.01, np.float32)
    second = deliver(core, "a", result_messages(task, update), 1.0)  # accepted, next task
    out += second + deliver(core, "a", result_messages(task, update), 2.0)  # duplicate
    out += deliver(core, "a", result_messages(task_of(second, "a"), version=7), 3.0)  # refused
    built = [msg for msg in sent(out, "a") if isinstance(msg, m.Task | m.Ack)]
    assert sum(isinstance(x, m.Task) for x in built) >= 2
    assert {(x.accepted, x.reason) for x in built if isinstance(x, m.Ack)} == {
        (True, ""),
        (False, "duplicate"),
        (False, "version"),
    }
    for msg in built:
        assert _checked(msg) == msg
        assert m.encode(_checked(msg)) == m.encode(msg)
        assert m.decode(m.encode(msg)) == msg


def test_resolved_tasks_leave_the_book_and_late_copies_are_answered_from_outcomes() -> None:
    core = make_core()
    update = np.full(core.params.num_params, 1e-3, np.float32)
    task = first = task_of(core.connect("a", hello("a"), 0.0), "a")
    for i in range(40):
        task = task_of(deliver(core, "a", result_messages(task, update), 1.0 + i), "a")
    assert core.accepted_results == 40
    # only the open task and its lease stay; 40 outcomes are remembered
    assert list(core.book.tasks) == [int(task.task_id)]
    assert len(core.book.leases) == 1
    assert len(core.book.accepted_ids()) == 40
    late = deliver(core, "a", result_messages(first, update), 50.0)
    assert acks(late, "a") == [(first.task_id, False, "duplicate")]
    # past the retention the outcome is forgotten: the id was issued, so stale
    retain = core.book.retain_s
    assert retain >= 2 * core.job.lease.resume_grace_s
    core.tick(50.0 + retain + 1)
    assert core.book.accepted_ids() == []
    t_b = task_of(core.connect("b", hello("b"), 50.0 + retain + 2), "b")
    out = deliver(core, "b", result_messages(first, update), 50.0 + retain + 3)
    assert acks(out, "b") == [(first.task_id, False, "stale")]
    never = m.Task(**{**{n: getattr(t_b, n) for n, *_ in t_b._PLAN}, "task_id": "999999"})
    out = deliver(core, "b", result_messages(never, update), 50.0 + retain + 4)
    assert acks(out, "b") == [("999999", False, "unknown_task")]
    assert core.accepted_results == 40


def test_restored_core_answers_duplicates_of_checkpointed_results_for_the_retention() -> None:
    core = make_core()
    task = task_of(core.connect("a", hello("a"), 0.0), "a")
    deliver(core, "a", result_messages(task), 1.0)
    state = core.state_dict()
    assert state["accepted_tasks"] == [int(task.task_id)]
    again = restore_core(core.job, state, dataset=digits())
    again.connect("a", hello("a"), 100.0)
    out = deliver(again, "a", result_messages(task, version=task.model_version), 101.0)
    assert acks(out, "a") == [(task.task_id, False, "duplicate")]
    assert again.state_dict()["accepted_tasks"] == [int(task.task_id)]  # carried on
    again.tick(102.0)  # the first tick starts their retention (the book has no clock)
    again.tick(102.0 + again.book.retain_s - 1)
    assert again.state_dict()["accepted_tasks"] == [int(task.task_id)]
    again.tick(102.0 + again.book.retain_s + 1)
    assert again.state_dict()["accepted_tasks"] == []


def test_a_seeded_client_builds_version_zero_itself_and_gets_no_model() -> None:
    core = make_core(model={"init_seed": 5})
    out = core.connect("a", hello("a", init_schemes=("pcg64", INIT_SCHEME)), 0.0)
    task = task_of(out, "a")
    assert task.init_seed == 5 and task.num_chunks == 0 and task.base_version is None
    assert task.init_scheme == INIT_SCHEME
    assert task.init_crc == crc32(core.params.data)
    assert _checked(task) == task and m.decode(m.encode(task)) == task
    assert sent(out, "a", m.Chunk) == []
    (leased,) = only(out, ev.TaskLeased)
    assert (leased.download, leased.download_bytes) == ("seed", 0)
    assert core.job.spec.init_params(5).array_equal(core.params)  # what the client builds
    # a client without the capability, in the same job, downloads version 0; so does
    # an older one that only reproduces NumPy's PCG64 init (hello.seeded_init)
    plain = core.connect("b", hello("b"), 0.5)
    assert task_of(plain, "b").init_seed is None and sent(plain, "b", m.Chunk)
    old = core.connect("c", hello("c", seeded_init=True), 0.6)
    assert task_of(old, "c").init_seed is None and sent(old, "c", m.Chunk)
    # later versions are downloaded as usual
    out = deliver(core, "a", result_messages(task), 1.0)
    assert acks(out, "a") == [(task.task_id, True, "")]
    nxt = task_of(out, "a")
    assert nxt.model_version == 1 and nxt.init_seed is None and nxt.num_chunks > 0


def test_a_core_started_from_given_params_never_seeds() -> None:
    job = make_job()
    params = job.spec.init_params(job.model.init_seed)
    params.W[0][0, 0] += 1.0  # not the seed's version 0
    core = build_core(job, params, dataset=digits())
    task = task_of(core.connect("a", hello("a", init_schemes=(INIT_SCHEME,)), 0.0), "a")
    assert task.init_seed is None and task.num_chunks > 0


@pytest.mark.parametrize(
    "fields",
    [
        {"init_seed": 1, "init_crc": 2, "model_version": 3},  # only version 0
        {"init_seed": 1},  # needs the checksum
        {"init_crc": 2, "base_version": 0},  # checksum without a seed
        {"init_seed": 1, "init_crc": 2, "model_transfer": "m", "num_chunks": 2},  # and chunks
        {"init_seed": 1, "init_crc": 2, "base_version": 0},
        {"init_scheme": "x128ss-ih12", "base_version": 0},  # a scheme without a seed
    ],
)
def test_seeded_task_fields_are_checked(fields: dict) -> None:
    base = {"task_id": "1", "model_version": 0, "spec": make_job().spec, "dataset": "d"}
    with pytest.raises(ValueError, match="init_"):
        m.Task(**{**base, **fields})


def test_spans_are_negotiated_per_client() -> None:
    core = make_core()
    n_blocks = 2 * core.job.spec.num_layers
    out = core.connect("a", hello("a", spans=True), 0.0)
    (welcome,) = sent(out, "a", m.Welcome)
    assert welcome.spans  # this server takes spanning result chunks
    task = task_of(out, "a")
    spanned = sent(out, "a", m.Chunk)
    assert task.num_chunks == len(spanned) < n_blocks and spanned[0].blocks > 1
    # a client without the flag, in the same job, gets one block per chunk
    plain_out = core.connect("b", hello("b"), 0.5)
    plain = sent(plain_out, "b", m.Chunk)
    assert len(plain) >= n_blocks and all(c.blocks == 1 for c in plain)
    assert b"blocks" not in m.encode(plain[0])
    # the spanning result is applied like any other
    out = deliver(core, "a", result_messages(task, spans=True), 1.0)
    assert acks(out, "a") == [(task.task_id, True, "")]
    assert len(result_messages(task, spans=True)) == 2  # the result and one chunk
    # the frames are built once per version for each kind of client, and a new
    # version drops the old ones (docs: Coordinator._model_chunks)
    v = core.model.version
    assert v == 1 and task_of(out, "a").model_version == v  # "a" got version 1 at once
    assert {k[1]: e[0] for k, e in core.downloads._cache.items()} == {True: v}
    core.connect("c", hello("c"), 1.5)
    core.connect("d", hello("d", spans=True), 1.6)
    assert {k[1]: e[0] for k, e in core.downloads._cache.items()} == {False: v, True: v}


def test_a_task_carries_its_shards_rows_from_the_coordinators_catalog() -> None:
    """The weight a mean gives a result (FedAvg) is the rows the coordinator cut
    for the task's shard, never a count the client claims (result.samples)."""
    core = make_core("decentral-sync", data={"shards": 3, "sharding": "label_skew"})
    rows = [s.rows for s in core.data.shards]
    assert len(set(rows)) > 1  # unequal shards: the case where weights matter
    for name in "abc":
        core.connect(name, hello(name), 0.0)
    tasks = list(core.book.tasks.values())
    assert tasks and all(t.rows == rows[t.shard] for t in tasks)


def test_a_timed_evaluator_keeps_evaluations_under_their_share_of_time() -> None:
    """100 versions a second, every version due, each evaluation taking 50 ms on the
    evaluator's clock: at most ``max_share`` (5 %) of the time goes to them; without
    a clock (the simulator) every due version is evaluated, as before."""
    from coordinator.core.config import EvalSection
    from coordinator.core.evaluation import Evaluator

    class Clock:  # an evaluation reads it twice: it took 50 ms in between
        def __init__(self) -> None:
            self.t, self.reads = 0.0, 0

        def __call__(self) -> float:
            self.reads += 1
            if self.reads % 2 == 0:
                self.t += 0.05
            return self.t

    cfg = EvalSection(every_versions=1, max_samples=50)
    params = make_core().params
    clock = Clock()
    timed, untimed = Evaluator(digits(), cfg, timer=clock), Evaluator(digits(), cfg)
    runs = {"timed": 0, "untimed": 0}
    for v in range(1, 1001):  # 10 s at 100 versions/s
        now = v * 0.01
        clock.t = max(clock.t, now)
        for name, ev_ in (("timed", timed), ("untimed", untimed)):
            if ev_.due(v, now):
                ev_.run(params, v, now)
                runs[name] += 1
    assert timed.cost is not None and abs(timed.cost - 0.05) < 1e-9
    slow_start = Evaluator(digits(), cfg, timer=iter([0.0, 30.0, 30.0, 30.01]).__next__)
    slow_start.run(params, 1, 0.0)  # a first run that compiled for 30 s
    assert slow_start.cost is None and slow_start.due(2, 0.01)
    slow_start.run(params, 2, 0.01)
    assert slow_start.cost is not None and abs(slow_start.cost - 0.01) < 1e-9
    assert timed.last is not None and timed.last.seconds is not None
    assert 0.05 * (runs["timed"] - 1) / 10.0 <= cfg.max_share + 0.005  # the first: warm-up
    assert runs["timed"] >= 9 and runs["untimed"] == 1000
    assert untimed.last is not None and untimed.last.seconds is None


def test_a_client_on_a_slow_link_is_given_the_shard_it_holds_when_the_cycle_allows() -> None:
    """Shard affinity: where fetching a shard takes longer than a task computes,
    a new cycle starts with the shard the client trained on last, not a new one
    to fetch; on a fast link the cycle's own order is kept."""
    slow = make_core(link={"profile": "roblox"}, lease={"min_s": 600.0, "slack": 1.0})
    conn_out = slow.connect("a", hello("a", data=True), 0.0)
    shards, task, t = [], task_of(conn_out, "a"), 0.0
    for _ in range(12):  # three cycles of the job's 4 shards
        shards.append(slow.book.tasks[int(task.task_id)].shard)
        t += 30.0
        out = deliver(slow, "a", result_messages(task), t) + slow.tick(t + 1.0)
        task = task_of(out, "a")
    cycles = [shards[i : i + 4] for i in range(0, 12, 4)]
    assert all(sorted(c) == [0, 1, 2, 3] for c in cycles)  # every shard once a cycle
    assert cycles[1][0] == cycles[0][-1] and cycles[2][0] == cycles[1][-1]
    fast = make_core()  # lan: a shard is fetched in a blink
    task_of(fast.connect("a", hello("a", data=True), 0.0), "a")  # it holds a shard now
    assert fast.issuer.view(fast.conns["a"], fast.registry.get("a"), connected=1).held == ()
    assert slow.issuer.view(slow.conns["a"], slow.registry.get("a"), connected=1).held
    # The same slow link under a task that computes longer than the fetch (a
    # slow client here; the large preset's 27-s tasks against a 0.8-s fetch):
    # the order is kept, so the shard a client trains on varies from task to task.
    busy = make_core(link={"profile": "roblox"}, lease={"min_s": 600.0, "slack": 1.0})
    task_of(busy.connect("a", m.Hello(client="a", flops=5e4, data=True), 0.0), "a")
    conn, rec = busy.conns["a"], busy.registry.get("a")
    assert rec.shards_held  # it holds one, and fetching another is not worth keeping it
    fetch_s = busy.data.mean_bytes / conn.limits.bytes_per_s
    assert busy.issuer.compute_seconds(conn, rec) > fetch_s > busy.job.strategy.task_seconds
    assert busy.issuer.view(conn, rec, connected=1).held == ()
