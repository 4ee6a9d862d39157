"""The per-frame series (``FrameCounts``): plain integers per thread, scraped as the
labelled prometheus-client ``Counter`` pair they replace."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from coordinator.core import events as ev
from coordinator.http.metrics import Metrics
from protocol import messages as m


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Counter samples of the frame families by (name, labels); ``_created`` as 1.0
    (present), since its value is a wall-clock time."""
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        if family.name not in ("crowdgrad_messages", "crowdgrad_message_bytes"):
            continue
        assert family.type == "counter"
        for s in family.samples:
            value = 1.0 if s.name.endswith("_created") else s.value
            out[(s.name, tuple(sorted(s.labels.items())))] = value
    return out


def test_frame_series_scrape_as_the_labelled_counters_they_replace() -> None:
    metrics = Metrics()
    r = CollectorRegistry()
    frames = Counter(
        "crowdgrad_messages_total", "Websocket frames by direction and message type.",
        ["direction", "type"], registry=r,
    )  # fmt: skip
    sizes = Counter(
        "crowdgrad_message_bytes_total", "Websocket frame bytes by direction and type.",
        ["direction", "type"], registry=r,
    )  # fmt: skip

    def both(direction: str, kind: str, n: int) -> None:
        frames.labels(direction, kind).inc()
        sizes.labels(direction, kind).inc(n)

    metrics.frame_in("result", 120)
    both("in", "result", 120)
    metrics.frame_in("chunk", 700)
    both("in", "chunk", 700)
    metrics.frame_out("heartbeat", 40)
    both("out", "heartbeat", 40)
    ack = m.Ack(task_id="7", accepted=True)
    frame = m.encode(ack)
    metrics([ev.Send(client_id="c1", message=ack, frame=frame)] * 2)
    both("out", "ack", len(frame))
    both("out", "ack", len(frame))
    metrics.frame_out("ack", 10)  # the same series from the other thread's table
    both("out", "ack", 10)
    got = _samples(metrics.exposition())
    assert got == _samples(generate_latest(r))
    assert got[("crowdgrad_messages_total", (("direction", "out"), ("type", "ack")))] == 3


def test_frame_counts_lose_nothing_with_both_threads_counting() -> None:
    metrics = Metrics()
    ack = m.Ack(task_id="7", accepted=True)
    sends = [ev.Send(client_id="c1", message=ack, frame=m.encode(ack))] * 100
    n = 2000

    def core() -> None:
        for _ in range(n // 100):
            metrics(sends)

    t = threading.Thread(target=core)
    t.start()
    for _ in range(n):
        metrics.frame_out("ack", 1)
    t.join()
    totals = metrics.frames.totals()
    assert totals[("out", "ack")][0] == 2 * n
