"""CoreService hands outputs to its sinks in batches, in order, and never sits on them."""

from __future__ import annotations

import threading

from coordinator.core import events as ev
from coordinator.core.config import parse_job
from coordinator.runtime.service import MAX_BATCH, CoreService
from protocol import messages as m

JOB = {"model": {"widths": [64, 3, 10]}, "data": {"shards": 2, "batch": 2}}


class Sink:
    def __init__(self) -> None:
        self.calls: list[list[ev.Output]] = []
        self.changed = threading.Condition()

    def __call__(self, outputs: list[ev.Output]) -> None:
        with self.changed:
            self.calls.append(list(outputs))
            self.changed.notify_all()

    def welcomed(self) -> list[str]:
        with self.changed:
            return [
                o.client_id
                for call in self.calls
                for o in call
                if isinstance(o, ev.Send) and isinstance(o.message, m.Welcome)
            ]

    def wait(self, n: int, timeout: float = 10.0) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: len(self.welcomed()) >= n, timeout)


def test_queued_inputs_share_one_hand_over_in_order() -> None:
    sink, gate = Sink(), threading.Event()
    n = MAX_BATCH + 10
    with CoreService(parse_job(JOB)) as service:
        service.add_sink(sink)
        service.call(lambda core: gate.wait(10))  # hold the core thread while input queues
        for i in range(n):
            service.submit_connect(f"c{i}", m.Hello(client=f"c{i}"))
        gate.set()
        assert sink.wait(n)
    assert sink.welcomed() == [f"c{i}" for i in range(n)]
    # one hand-over per MAX_BATCH inputs, not one per input
    assert len(sink.calls) <= n // MAX_BATCH + 2


def test_a_lone_input_is_handed_over_without_waiting_for_more() -> None:
    sink = Sink()
    with CoreService(parse_job(JOB), tick_hz=0.01) as service:  # no tick to flush it
        service.add_sink(sink)
        service.submit_connect("solo", m.Hello(client="solo"))
        assert sink.wait(1)
    assert sink.welcomed() == ["solo"]


def test_every_accepted_result_is_acked_before_the_bye_when_acks_wait_for_durability(
    tmp_path,
) -> None:
    """Acks held for a durable commit (``ack_durable``) are not lost at the end of the
    job: the bye and the close wait for them, and ``done`` comes after (§3.9)."""
    from tests.coordinator.coord_helpers import result_messages

    job = parse_job({**JOB, "stop": {"max_versions": 3}})
    sink = Sink()
    # A long interval: after the first, acks stay held until the job ends.
    with CoreService(job, store=tmp_path / "store", durable_interval=1e4) as service:
        assert service.ack_durable
        service.add_sink(sink)
        service.submit_connect("a", m.Hello(client="a"))
        for n in range(1, 4):
            with sink.changed:
                assert sink.changed.wait_for(lambda n=n: len(_sent(sink, m.Task)) >= n, 10)
            for msg in result_messages(_sent(sink, m.Task)[-1]):
                service.submit_receive("a", msg, len(m.encode(msg)))
        assert service.done.wait(10)
        outs = [o for call in sink.calls for o in call]
    frames = [o.message for o in outs if isinstance(o, ev.Send) and o.client_id == "a"]
    kinds = [type(f) for f in frames if isinstance(f, m.Ack | m.Bye)]
    assert kinds == [m.Ack, m.Ack, m.Ack, m.Bye]
    assert all(f.accepted for f in frames if isinstance(f, m.Ack))
    assert sum(isinstance(o, ev.ResultAccepted) for o in outs) == 3
    closes = [i for i, o in enumerate(outs) if isinstance(o, ev.Close)]
    bye = next(
        i
        for i, o in enumerate(outs)
        if isinstance(o, ev.Send) and o.message == m.Bye(reason="finished", detail="max_versions")
    )
    assert closes and closes[0] > bye


def _sent(sink: Sink, kind: type) -> list:
    return [
        o.message
        for call in list(sink.calls)
        for o in call
        if isinstance(o, ev.Send) and isinstance(o.message, kind)
    ]


def _never(task_id: int) -> bool:
    return False


def test_acks_of_results_no_checkpoint_holds_at_the_end_become_stale_refusals(tmp_path) -> None:
    """Issue 34 / §6: at the end of a job, results a sync buffer took but never
    merged are in no checkpoint; their held acks were dropped silently. Each is
    now answered ``accepted=false`` (``stale``), before the bye."""
    service = CoreService(parse_job(JOB), store=tmp_path / "s.db")
    sent: list[ev.Output] = []
    service.add_sink(sent.extend)
    ack = m.Ack(task_id="7", accepted=True)
    held = service.acks.admit([ev.Send(client_id="c1", message=ack, frame=m.encode(ack))], _never)
    assert held == []
    bye = m.Bye(reason="finished")
    finished = ev.JobFinished(version=3, reason="max_versions", accuracy=0.5, now=1.0)
    tail = [ev.Send(client_id="c1", message=bye, frame=m.encode(bye))]
    assert service.acks.end([finished, *tail]) == [finished]
    service._inflight = 1
    service._written(1, 3, "exists", frozenset())  # that version's copy was older
    assert [(type(o.message), o.message) for o in sent if isinstance(o, ev.Send)] == [
        (m.Ack, m.Ack(task_id="7", accepted=False, reason="stale")),
        (m.Bye, bye),
    ]
    assert service.done.is_set()


def test_receives_handed_over_together_are_taken_in_order_and_held_while_paused() -> None:
    """``submit_receives``: one hand-over for several frames (the server's batched
    heartbeats), each taken as ``submit_receive`` would take it: in order, and a
    result held while paused until the core resumes."""
    from tests.coordinator.coord_helpers import result_messages

    sink = Sink()
    with CoreService(parse_job(JOB)) as service:
        service.add_sink(sink)
        service.submit_connect("a", m.Hello(client="a"))
        with sink.changed:
            assert sink.changed.wait_for(lambda: len(_sent(sink, m.Task)) >= 1, 10)
        service.set_paused(True)
        beat = m.Heartbeat(seq=1, time=1.0)
        frames = [beat, *result_messages(_sent(sink, m.Task)[0]), m.Heartbeat(seq=2, time=2.0)]
        service.submit_receives([("a", f, len(m.encode(f))) for f in frames])
        assert service.call(lambda core: None).result(10) is None  # taken by now
        assert service.stats.held_results == {"a"}
        assert service.stats.accepted == 0
        service.set_paused(False)
        with sink.changed:
            assert sink.changed.wait_for(lambda: len(_sent(sink, m.Ack)) >= 1, 10)
        seen = service.call(lambda core: core.registry.get("a").last_seen).result(10)
    assert [a.accepted for a in _sent(sink, m.Ack)] == [True]
    assert service.stats.accepted == 1 and seen > 0
