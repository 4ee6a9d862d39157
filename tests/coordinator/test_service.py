"""CoreService hands outputs to its sinks in batches, in order, and never sits on them."""

from __future__ import annotations

import threading

from coordinator import events as ev
from coordinator.config import parse_job
from coordinator.service import MAX_BATCH, CoreService
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
