"""The sans-IO client session: messages in, actions out."""

from __future__ import annotations

import math

import numpy as np
import pytest

from client.session import (
    MAX_UNACKED,
    Capabilities,
    ClientSession,
    ComputeRequest,
    Finished,
    Phase,
    Send,
)
from nn.params import Params
from nn.spec import INIT_SCHEME, ModelSpec
from protocol import messages as m
from protocol.checksum import crc32
from protocol.chunking import chunk_params
from protocol.limits import PROFILES, LinkLimits
from protocol.reassembly import Reassembler

SPEC = ModelSpec(widths=(8, 6, 3))
LAN = PROFILES["lan"]


def welcome(
    token: str = "tok", limits: LinkLimits = LAN, hb: float = 5.0, spans: bool = False
) -> m.Welcome:
    return m.Welcome(
        session_id="s", resume_token=token, limits=limits, heartbeat_interval=hb, spans=spans
    )


def task_with_model(task_id: str, version: int, params: Params) -> list[m.Message]:
    chunks = chunk_params(params, max_message_bytes=1024, transfer=f"model-{version}")
    t = m.Task(
        task_id=task_id,
        kind="train",
        model_version=version,
        spec=SPEC,
        dataset="digits#0",
        steps=2,
        batch=4,
        model_transfer=f"model-{version}",
        num_chunks=len(chunks),
    )
    return [t, *chunks]


def feed(s: ClientSession, msgs: list[m.Message], now: float) -> list:
    out: list = []
    for msg in msgs:
        out += s.receive(msg, now)
    return out


def ready_session(**kw) -> ClientSession:
    s = ClientSession("alice", Capabilities(flops=2e9, **kw), seed=0)
    s.start(0.0)
    s.receive(welcome(), 0.1)
    return s


def sends(actions: list) -> list[m.Message]:
    return [a.message for a in actions if isinstance(a, Send)]


def test_hello_then_welcome() -> None:
    s = ClientSession("alice", Capabilities(flops=2e9, cores=4), seed=0)
    (hello,) = s.start(0.0)
    assert isinstance(hello, Send) and hello.frame == m.encode(hello.message)
    assert hello.message.client == "alice" and hello.message.flops == 2e9
    assert hello.message.resume is None
    s.receive(welcome("T1"), 0.1)
    assert s.phase is Phase.READY and s.resume_token == "T1"


def test_model_download_then_compute_then_result() -> None:
    s = ready_session()
    model = SPEC.init_params(1)
    out = feed(s, task_with_model("7", 3, model), 1.0)
    reqs = [a for a in out if isinstance(a, ComputeRequest)]
    assert len(reqs) == 1 and reqs[0].task.task_id == "7"
    assert reqs[0].params.array_equal(model) and s.model_version == 3
    update = np.linspace(-1, 1, SPEC.num_params).astype(np.float32)
    out = s.compute_done(reqs[0].request_id, update, 2.0, loss=0.5, samples=8, steps=2)
    msgs = sends(out)
    res = msgs[0]
    assert isinstance(res, m.Result) and res.task_id == "7" and res.model_version == 3
    assert res.num_chunks == len(msgs) - 1 and res.loss == 0.5
    re = Reassembler.for_params(SPEC, transfer="7", total=res.num_chunks)
    for c in msgs[1:]:
        re.add(c)
    assert np.array_equal(re.params().data, update)
    # acknowledged: nothing pending any more
    s.receive(m.Ack(task_id="7", accepted=True), 2.5)
    assert s.pending is None


def test_cached_model_needs_no_download() -> None:
    s = ready_session()
    feed(s, task_with_model("1", 5, SPEC.init_params(0)), 1.0)
    t2 = m.Task(task_id="2", model_version=5, spec=SPEC, dataset="digits#0", base_version=5)
    out = s.receive(t2, 2.0)
    assert [type(a) for a in out] == [ComputeRequest]


def test_new_task_supersedes_running_compute() -> None:
    s = ready_session()
    first = feed(s, task_with_model("1", 0, SPEC.init_params(0)), 1.0)[-1]
    second = feed(s, task_with_model("2", 1, SPEC.init_params(1)), 2.0)[-1]
    upd = np.zeros(SPEC.num_params, np.float32)
    assert s.compute_done(first.request_id, upd, 3.0) == []
    assert sends(s.compute_done(second.request_id, upd, 3.0))[0].task_id == "2"


def test_result_finished_offline_is_sent_after_resume() -> None:
    s = ready_session()
    req = feed(s, task_with_model("9", 0, SPEC.init_params(0)), 1.0)[-1]
    s.connection_lost(1.5)
    assert s.phase is Phase.OFFLINE
    upd = np.ones(SPEC.num_params, np.float32)
    assert s.compute_done(req.request_id, upd, 2.0) == []  # offline: kept
    (hello,) = s.start(3.0)
    assert hello.message.resume == "tok"
    out = s.receive(welcome("tok"), 3.1)
    msgs = sends(out)
    assert isinstance(msgs[0], m.Result) and msgs[0].task_id == "9"
    s.receive(m.Ack(task_id="9", accepted=False, reason="duplicate"), 3.2)
    assert s.pending is None


def test_heartbeats_and_rtt() -> None:
    s = ClientSession("a", seed=0)
    s.start(0.0)
    s.receive(welcome(hb=2.0), 0.0)
    assert s.next_wakeup() == pytest.approx(2.0)
    assert s.tick(1.0) == []
    (hb,) = sends(s.tick(2.0))
    assert isinstance(hb, m.Heartbeat) and hb.time == 2.0
    assert hb.echo is None and hb.held is None  # nothing of the server's to echo yet
    s.receive(m.Heartbeat(seq=hb.seq, time=100.0, echo=2.0), 2.25)
    assert s.rtt == pytest.approx(0.25)
    (hb,) = sends(s.tick(4.25))
    # the server's time, and how long it was held here: its RTT = now - 100 - 2
    assert hb.echo == 100.0 and hb.held == pytest.approx(2.0)


def test_a_new_connection_echoes_no_old_clock() -> None:
    s = ClientSession("a", seed=0)
    s.start(0.0)
    s.receive(welcome(hb=2.0), 0.0)
    s.receive(m.Heartbeat(seq=1, time=100.0, echo=0.0), 0.5)
    s.connection_lost(1.0)
    s.start(1.5)
    s.receive(welcome(hb=2.0), 1.5)
    (hb,) = sends(s.tick(3.5))
    assert hb.echo is None and hb.held is None


def test_a_finished_bye_finishes() -> None:
    s = ready_session()
    out = s.receive(m.Bye(reason="finished", detail="target_accuracy"), 1.0)
    assert out == [Finished(reason="target_accuracy")]
    assert s.phase is Phase.FINISHED and s.bye is not None and s.bye.finished
    with pytest.raises(ValueError, match="not connected"):
        s.receive(m.Heartbeat(seq=1), 2.0)
    with pytest.raises(ValueError, match="not allowed"):
        s.start(3.0)


def test_upload_is_paced_to_granted_limits() -> None:
    slow = LinkLimits(bytes_per_s=2000, messages_per_s=2, max_message_bytes=1024)
    s = ClientSession("a", seed=0)
    s.start(0.0)
    s.receive(welcome(limits=slow, hb=1e3), 0.0)
    req = feed(s, task_with_model("1", 0, SPEC.init_params(0)), 0.0)[-1]
    upd = np.zeros(SPEC.num_params, np.float32)
    first = s.compute_done(req.request_id, upd, 0.0)
    total = len(s.pending.messages)
    got, t = len(first), 0.0
    assert got < total
    while got < total:
        t = s.next_wakeup()
        assert t is not None and math.isfinite(t)
        got += len(sends(s.tick(t)))
    assert t >= (total - slow.burst_messages) / slow.messages_per_s - 1e-9


def _seeded_task(seed: int, crc: int, scheme: str | None = INIT_SCHEME) -> m.Task:
    return m.Task(
        task_id="1",
        model_version=0,
        spec=SPEC,
        dataset="digits#0",
        init_seed=seed,
        init_crc=crc,
        init_scheme=scheme,
    )


@pytest.mark.parametrize("scheme", [INIT_SCHEME, None])
def test_version_zero_is_built_from_the_init_seed_and_checked(scheme: str | None) -> None:
    s = ClientSession("alice", Capabilities(flops=2e9), seed=0)
    (hello,) = s.start(0.0)
    # the portable scheme, and NumPy's PCG64 of older coordinators (no task.init_scheme)
    assert hello.message.init_schemes == (INIT_SCHEME,) and hello.message.seeded_init
    s.receive(welcome(), 0.1)
    want = SPEC.init_params(7, scheme=scheme or "pcg64")
    assert not want.array_equal(SPEC.init_params(7, scheme="pcg64" if scheme else INIT_SCHEME))
    out = s.receive(_seeded_task(7, crc32(want.data), scheme), 1.0)
    (req,) = [a for a in out if isinstance(a, ComputeRequest)]
    assert req.params.array_equal(want) and s.model_version == 0


def test_a_different_version_zero_stops_the_client_instead_of_training_on_it() -> None:
    s = ready_session()
    out = s.receive(_seeded_task(7, crc32(SPEC.init_params(8).data)), 1.0)
    (fin,) = [a for a in out if isinstance(a, Finished)]
    assert "init_seed 7" in fin.reason and not any(isinstance(a, ComputeRequest) for a in out)
    assert s.model is None


def test_a_client_may_leave_seeded_init_off() -> None:
    caps = Capabilities(seeded_init=False, init_schemes=())
    (hello,) = ClientSession("bob", caps, seed=0).start(0.0)
    assert hello.message.seeded_init is False and "init_schemes" not in hello.message.to_wire()


@pytest.mark.parametrize(("caps", "server", "frames"), [(True, True, 1), (True, False, 4),
                                                       (False, True, 4)])  # fmt: skip
def test_result_chunks_span_blocks_only_when_both_sides_said_so(caps, server, frames) -> None:
    s = ClientSession("alice", Capabilities(flops=2e9, spans=caps), seed=0)
    (hello,) = s.start(0.0)
    assert hello.message.spans is caps
    s.receive(welcome(spans=server), 0.1)
    (req,) = [a for a in feed(s, task_with_model("7", 3, SPEC.init_params(1)), 1.0)
              if isinstance(a, ComputeRequest)]  # fmt: skip
    update = np.linspace(-1, 1, SPEC.num_params).astype(np.float32)
    res, *chunks = sends(s.compute_done(req.request_id, update, 2.0))
    assert res.num_chunks == len(chunks) == frames  # SPEC has 2 layers: 4 blocks
    re = Reassembler.for_params(SPEC, transfer="7", total=res.num_chunks)
    for c in chunks:
        re.add(m.decode(m.encode(c)))
    assert np.array_equal(re.params().data, update)


def test_a_spanning_model_download_is_reassembled() -> None:
    s = ready_session()
    model = SPEC.init_params(2)
    chunks = chunk_params(model, max_message_bytes=1024, transfer="model-4", spans=True)
    assert len(chunks) == 1
    t = m.Task(task_id="9", model_version=4, spec=SPEC, dataset="digits#0",
               model_transfer="model-4", num_chunks=1)  # fmt: skip
    (req,) = [a for a in feed(s, [t, *chunks], 1.0) if isinstance(a, ComputeRequest)]
    assert req.params.array_equal(model)


def prefetching_session(flops: float = 2e9) -> ClientSession:
    s = ClientSession("alice", Capabilities(flops=flops), seed=0)
    s.start(0.0)
    s.receive(m.Welcome(session_id="s", resume_token="t", limits=LAN, prefetch=True), 0.1)
    return s


def test_without_the_servers_offer_there_is_no_prefetch() -> None:
    s = ready_session()  # welcome without prefetch
    req = feed(s, task_with_model("1", 0, SPEC.init_params(0)), 1.0)[-1]
    assert s.prefetch_delay() is None
    assert s.prefetch(1.5, req.request_id) == []


def test_a_prefetched_task_waits_for_the_running_compute_then_starts() -> None:
    s = prefetching_session(flops=1e3)
    assert s.rtt == pytest.approx(0.1)  # hello at 0.0, welcome at 0.1
    v0 = SPEC.init_params(0)
    first = feed(s, task_with_model("1", 0, v0), 1.0)[-1]
    assert isinstance(first, ComputeRequest)
    # no compute measured yet: the task's FLOPs at the advertised 1 kFLOP/s, less
    # the download just measured (task frame and chunks came at the same instant)
    # and the round trip
    flops = SPEC.flops_per_sample(train=True) * first.task.steps * first.task.batch
    assert s.prefetch_delay() == pytest.approx(flops / 1e3 - 0.1)
    (pf,) = sends(s.prefetch(1.2, first.request_id))
    assert isinstance(pf, m.Prefetch) and pf.task_id == "1"
    assert s.prefetch(1.3, first.request_id) == []  # one at a time
    # the answer is queued: its model downloads, nothing new starts
    v1 = SPEC.init_params(1)
    msgs = task_with_model("2", 1, v1)
    out = s.receive(msgs[0], 1.5)
    out += feed(s, msgs[1:], 1.9)
    assert [a for a in out if isinstance(a, ComputeRequest)] == []
    assert s.computing == first.request_id and s.next_task.task_id == "2"
    assert s.last_download_s == pytest.approx(0.4)
    assert first.params.array_equal(v0)  # the running compute's model is untouched
    # the running compute ends: its result goes up and the queued task starts at once
    upd = np.full(SPEC.num_params, 0.5, np.float32)
    out = s.compute_done(first.request_id, upd, 3.0, compute_seconds=2.0)
    assert sends(out)[0].task_id == "1"
    (second,) = [a for a in out if isinstance(a, ComputeRequest)]
    assert second.task.task_id == "2" and second.params.array_equal(v1)
    assert s.next_task is None
    # next time the request goes one measured download and a round trip before the
    # measured compute ends
    assert s.prefetch_delay() == pytest.approx(2.0 - 0.4 - 0.1)


def test_a_prefetched_task_whose_model_is_late_starts_when_it_lands() -> None:
    s = prefetching_session()
    first = feed(s, task_with_model("1", 0, SPEC.init_params(0)), 1.0)[-1]
    s.prefetch(1.2, first.request_id)
    msgs = task_with_model("2", 1, SPEC.init_params(1))
    s.receive(msgs[0], 1.5)
    out = s.compute_done(first.request_id, np.zeros(SPEC.num_params, np.float32), 2.0)
    assert [a for a in out if isinstance(a, ComputeRequest)] == []  # model not in yet
    out = feed(s, msgs[1:], 2.5)
    (req,) = [a for a in out if isinstance(a, ComputeRequest)]
    assert req.task.task_id == "2"


def test_a_task_nobody_asked_for_still_supersedes_and_a_drop_voids_the_prefetch() -> None:
    s = prefetching_session()
    first = feed(s, task_with_model("1", 0, SPEC.init_params(0)), 1.0)[-1]
    s.prefetch(1.2, first.request_id)
    s.connection_lost(1.3)
    assert s.next_task is None
    s.start(1.4)
    s.receive(m.Welcome(session_id="s", resume_token="t", limits=LAN, prefetch=True), 1.5)
    # after the reconnect the server's new task is not the prefetch's answer
    out = feed(s, task_with_model("3", 2, SPEC.init_params(2)), 2.0)
    (req,) = [a for a in out if isinstance(a, ComputeRequest)]
    assert req.task.task_id == "3" and s.computing == req.request_id
    assert s.compute_done(first.request_id, np.zeros(SPEC.num_params, np.float32), 2.5) == []


def test_winding_down_starts_no_queued_task_and_asks_for_none() -> None:
    s = prefetching_session()
    first = feed(s, task_with_model("1", 0, SPEC.init_params(0)), 1.0)[-1]
    s.prefetch(1.2, first.request_id)
    feed(s, task_with_model("2", 1, SPEC.init_params(1)), 1.5)
    s.wind_down()
    assert s.next_task is None and s.prefetch_delay() is None
    out = s.compute_done(first.request_id, np.zeros(SPEC.num_params, np.float32), 2.0)
    assert sends(out)[0].task_id == "1"  # the running task's result still goes up
    assert [a for a in out if isinstance(a, ComputeRequest)] == [] and s.computing is None


def test_another_bye_ends_the_connection_not_the_job() -> None:
    """Only reason ``finished`` means do not reconnect (§3.9): after any other bye
    the close follows, and the session connects again with its resume token."""
    s = ready_session()
    assert s.receive(m.Bye(reason="going away"), 1.0) == []
    assert s.phase is Phase.READY and s.bye is None
    s.connection_lost(1.1)
    (hello,) = s.start(2.0)
    assert hello.message.resume == "tok"


def decline_session() -> ClientSession:
    s = ClientSession("alice", Capabilities(flops=2e9), seed=0)
    s.start(0.0)
    s.receive(
        m.Welcome(session_id="s", resume_token="tok", limits=LAN, prefetch=True, decline=True),
        0.1,
    )
    return s


def test_a_compute_that_raises_declines_its_task() -> None:
    s = decline_session()
    req = feed(s, task_with_model("4", 0, SPEC.init_params(0)), 1.0)[-1]
    out = s.compute_failed(req.request_id, "memory: MemoryError", 2.0)
    assert sends(out) == [m.Decline(task_id="4", reason="memory: MemoryError")]
    assert s.task is None and s.computing is None and s.pending is None
    upd = np.zeros(SPEC.num_params, np.float32)
    assert s.compute_done(req.request_id, upd, 2.5) == []  # a late result: nothing
    assert s.compute_failed(req.request_id, "compute", 3.0) == []  # only once


def test_a_declined_task_lets_the_queued_one_start() -> None:
    s = decline_session()
    req = feed(s, task_with_model("1", 0, SPEC.init_params(0)), 1.0)[-1]
    assert sends(s.prefetch(1.5, req.request_id)) == [m.Prefetch(task_id="1")]
    t2 = m.Task(task_id="2", model_version=0, spec=SPEC, dataset="digits#0", base_version=0)
    assert s.receive(t2, 1.6) == []  # queued behind the running compute
    out = s.compute_failed(req.request_id, "compute: ValueError: bad optimizer", 2.0)
    assert sends(out) == [m.Decline(task_id="1", reason="compute: ValueError: bad optimizer")]
    (nxt,) = [a for a in out if isinstance(a, ComputeRequest)]
    assert nxt.task.task_id == "2"


@pytest.mark.parametrize(
    "task, word",
    [
        (m.Task(task_id="5", model_version=3, spec=SPEC, dataset="d", base_version=3), "model"),
        (m.Task(task_id="5", model_version=3, spec=SPEC, dataset="d", model_transfer="d-1-3",
                num_chunks=2, delta_base=1), "model"),
        (m.Task(task_id="5", model_version=0, spec=SPEC, dataset="d", base_version=0,
                upload_codec="zstd-9"), "codec"),
    ],
)  # fmt: skip
def test_a_task_this_client_cannot_do_is_declined_at_once(task: m.Task, word: str) -> None:
    """Rather than let the lease run to its deadline (§3.13)."""
    s = decline_session()
    if word == "codec":
        feed(s, task_with_model("0", 0, SPEC.init_params(0)), 0.5)  # holds version 0
    out = s.receive(task, 1.0)
    (dec,) = sends(out)
    assert isinstance(dec, m.Decline) and dec.task_id == "5"
    assert dec.reason.startswith(word + ":")
    assert not any(isinstance(a, ComputeRequest) for a in out) and s.declined == 1


def test_no_decline_to_a_server_that_does_not_take_it() -> None:
    s = ready_session()  # welcome.decline false
    req = feed(s, task_with_model("4", 0, SPEC.init_params(0)), 1.0)[-1]
    assert s.compute_failed(req.request_id, "compute", 2.0) == []
    assert s.task is None and s.declined == 1  # dropped here; its lease runs out


def test_a_bad_server_frame_is_refused_with_a_4xxx_close() -> None:
    """Browsers can only close with 1000 or 3000-4999: 4000 + code (§7)."""
    from client.session import Close
    from protocol.errors import ErrorCode, ProtocolError

    s = ready_session()
    out = s.refuse(ProtocolError(ErrorCode.MALFORMED, "frame is not one msgpack value"), 1.0)
    err, close = out
    assert isinstance(err, Send) and err.message.code == int(ErrorCode.MALFORMED)
    assert close == Close(code=4001, reason="MALFORMED")
    too_large = s.refuse(ProtocolError(ErrorCode.TOO_LARGE, "frame"), 1.0)[-1]
    assert too_large.code == 4005


def test_the_next_task_does_not_wait_for_the_ack_and_every_result_is_kept_until_acked() -> None:
    """A server may hold acks until results are durable (§6): the session computes on,
    and a result whose ack has not come yet is sent again after a reconnect."""
    s = ready_session()
    req = feed(s, task_with_model("1", 0, SPEC.init_params(0)), 1.0)[-1]
    upd = np.zeros(SPEC.num_params, np.float32)
    s.compute_done(req.request_id, upd, 2.0)
    t2 = m.Task(task_id="2", model_version=0, spec=SPEC, dataset="digits#0", base_version=0)
    (req2,) = s.receive(t2, 2.1)  # no ack for 1 yet: task 2 starts all the same
    assert isinstance(req2, ComputeRequest)
    s.compute_done(req2.request_id, upd, 3.0)
    assert list(s.unacked) == ["1", "2"] and s.pending.task_id == "2"
    s.receive(m.Ack(task_id="2", accepted=True), 3.1)  # acks in any order
    s.connection_lost(3.2)
    s.start(4.0)
    resent = [x for x in sends(s.receive(welcome("tok"), 4.1)) if isinstance(x, m.Result)]
    assert [r.task_id for r in resent] == ["1"]
    s.receive(m.Ack(task_id="1", accepted=False, reason="duplicate"), 4.2)
    assert s.unacked == {} and s.pending is None


def test_a_slice_from_a_sub_model_task_is_never_taken_for_the_whole_model() -> None:
    """§3.3.1: after a sub-model task the client holds a slice of version 5, so a
    task naming version 5 of the job's model as its base is declined."""
    s = decline_session()
    sub = ModelSpec(widths=(SPEC.widths[0], 3, SPEC.widths[-1]))
    chunks = chunk_params(sub.init_params(0), max_message_bytes=1024, transfer="sub-1-5")
    keep = np.array([0, 2, 5], dtype=np.uint32)
    t1 = m.Task(task_id="1", model_version=5, spec=sub, dataset="digits#0",
                model_transfer="sub-1-5", num_chunks=len(chunks), subnet=keep)  # fmt: skip
    (req,) = [a for a in feed(s, [t1, *chunks], 1.0) if isinstance(a, ComputeRequest)]
    assert req.params.spec == sub
    s.compute_done(req.request_id, np.zeros(sub.num_params, np.float32), 2.0)
    s.receive(m.Ack(task_id="1", accepted=True), 2.1)
    t2 = m.Task(task_id="2", model_version=5, spec=SPEC, dataset="digits#0", base_version=5)
    (decline,) = sends(s.receive(t2, 3.0))
    assert isinstance(decline, m.Decline) and decline.reason.startswith("model: base version 5")


def test_a_diverged_update_is_declined_not_uploaded() -> None:
    """A non-finite delta (a learning rate too high) cannot be encoded by a lossy
    codec and would be refused; the task is declined with the reason instead."""
    s = decline_session()
    req = feed(s, task_with_model("3", 0, SPEC.init_params(0)), 1.0)[-1]
    bad = np.full(SPEC.num_params, np.nan, dtype=np.float32)
    out = s.compute_done(req.request_id, bad, 2.0)
    assert sends(out) == [m.Decline(task_id="3", reason="diverged: the update is not finite")]
    assert s.pending is None


def _compute_unacked(s: ClientSession, n: int, now: float) -> float:
    """Model v0 downloaded (its task acked), then ``n`` tasks on it, each computed
    and uploaded, none acked."""
    upd = np.zeros(SPEC.num_params, np.float32)
    req = feed(s, task_with_model("first", 0, SPEC.init_params(0)), now)[-1]
    s.compute_done(req.request_id, upd, now)
    s.receive(m.Ack(task_id="first", accepted=True), now)
    for i in range(n):
        t = m.Task(task_id=f"t{i}", model_version=0, spec=SPEC, dataset="d", base_version=0)
        (req,) = [a for a in s.receive(t, now) if isinstance(a, ComputeRequest)]
        s.compute_done(req.request_id, upd, now + 0.01)
        now += 0.02
    return now


def test_with_max_unacked_results_the_next_task_waits_for_an_ack_instead_of_dropping(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 34: a server holding acks for its checkpoint made a fast client pass
    MAX_UNACKED and log a dropped result per task. Back-pressure instead: the
    next task computes once an ack frees a place, and no result is dropped."""
    s = ready_session()
    now = _compute_unacked(s, MAX_UNACKED, 1.0)
    assert len(s.unacked) == MAX_UNACKED
    waiting = m.Task(task_id="next", model_version=0, spec=SPEC, dataset="d", base_version=0)
    out = s.receive(waiting, now)
    assert not [a for a in out if isinstance(a, ComputeRequest)] and s.computing is None
    assert s.ack_waits == 1 and s.next_wakeup() <= now + waiting.deadline / 2
    assert not [a for a in s.tick(now + 1.0) if isinstance(a, ComputeRequest)]
    out = s.receive(m.Ack(task_id="t0", accepted=True), now + 2.0)
    (req,) = [a for a in out if isinstance(a, ComputeRequest)]
    assert req.task is waiting and s.computing == req.request_id
    s.compute_done(req.request_id, np.zeros(SPEC.num_params, np.float32), now + 3.0)
    assert len(s.unacked) == MAX_UNACKED and "next" in s.unacked
    assert s.results_dropped == 0 and "not kept" not in caplog.text


def test_a_task_waits_for_acks_at_most_half_its_lease_then_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A server may hold acks until more results come (a buffer bigger than what
    one client keeps): the wait ends at half the lease, and dropping is said once."""
    s = ready_session()
    now = _compute_unacked(s, MAX_UNACKED, 1.0)
    upd = np.zeros(SPEC.num_params, np.float32)
    for i in range(3):
        t = m.Task(task_id=f"late{i}", model_version=0, spec=SPEC, dataset="d", base_version=0)
        assert not [a for a in s.receive(t, now) if isinstance(a, ComputeRequest)]
        reqs: list[ComputeRequest] = []
        while not reqs:  # heartbeats, then the end of the wait
            wake = s.next_wakeup()
            assert wake is not None and wake <= now + t.deadline / 2 + 1e-9
            reqs = [a for a in s.tick(wake) if isinstance(a, ComputeRequest)]
        assert wake == pytest.approx(now + t.deadline / 2)
        s.compute_done(reqs[0].request_id, upd, wake + 0.01)
        now = wake + 0.02
    assert len(s.unacked) == MAX_UNACKED and s.results_dropped == 3
    assert caplog.text.count("not kept") == 1
