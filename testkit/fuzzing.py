"""Hostile frames against the real decoder and core, beside an honest client.

The frames of ``testkit.hostile`` go through what a server does with a frame:
``messages.decode`` with the link's size limit (a refusal closes the connection
with the error's close code, as the websocket server does), then the core. An
honest ``ClientSession`` trains on the same core through ``Loopback`` (real
encoding, real compute, virtual clock), so the report says whether the job
still makes progress. Sans-IO, so a million frames take minutes, not hours.
Anything but a ProtocolError out of the decoder, or any exception out of the
core, is a crash and is reported with the frame that caused it.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from coordinator.core import events as ev
from coordinator.core.machine import Coordinator
from protocol import messages as m
from protocol.errors import (
    CLOSE_NORMAL,
    CLOSE_UNSUPPORTED_DATA,
    ErrorCode,
    ProtocolError,
    close_code,
)
from testkit import hostile
from testkit.loopback import Loopback

#: Close codes docs/protocol.md §7 documents for the server.
DOCUMENTED_CLOSES = frozenset(
    {CLOSE_NORMAL, CLOSE_UNSUPPORTED_DATA} | {close_code(c) for c in ErrorCode}
)


@dataclass(slots=True)
class FuzzReport:
    frames: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    closes: Counter[int] = field(default_factory=Counter)
    connections: int = 0
    crashes: list[tuple[str, bytes, str]] = field(default_factory=list)
    honest_accepted: int = 0

    @property
    def undocumented_closes(self) -> dict[int, int]:
        return {c: n for c, n in self.closes.items() if c not in DOCUMENTED_CLOSES}


class _Loop(Loopback):
    """Loopback that leaves the hostile connections' outputs to the fuzzer.

    Every client but the honest one (``clients``) is hostile. It keeps only what
    the fuzzer reads (the last task ids, a count of the honest client's accepted
    results), not every output, so that a long run measures the core's memory.
    """

    closed: list[tuple[str, int]]
    task_ids: deque[str]
    accepted: int

    def _core(self, outputs: list[ev.Output]) -> None:
        honest = []
        for o in outputs:
            cid = getattr(o, "client_id", None)
            if cid is not None and cid not in self.clients:
                if isinstance(o, ev.Close):
                    self.closed.append((cid, o.code))
                elif isinstance(o, ev.Send) and isinstance(o.message, m.Task):
                    self.task_ids.append(o.message.task_id)
                continue
            if isinstance(o, ev.ResultAccepted):
                self.accepted += 1
            honest.append(o)
        super()._core(honest)
        self.outputs.clear()


def fuzz(core: Coordinator, frames: int, *, seed: int = 0, every: int = 200) -> FuzzReport:
    """Send ``frames`` hostile frames to ``core`` while one honest client trains;
    ``every`` frames the virtual clock moves on 10 ms and the honest side runs."""
    rng = random.Random(seed)
    lb = _Loop(core)
    lb.closed, lb.task_ids, lb.accepted = [], deque(maxlen=50), 0
    lb.add_client("honest")
    report = FuzzReport()
    limit = core.limits.max_message_bytes
    cid: str | None = None
    for i in range(frames):
        if i % every == 0:
            lb.run(until=lb.now + 0.01)
        now = lb.now
        if cid is None:
            report.connections += 1
            cid = f"h{report.connections}"
            hello = m.Hello(client=f"fuzz-{rng.randrange(10**6)}", data=rng.random() < 0.5)
            lb._core(core.connect(cid, hello, now))
            if _closed(lb, cid, report):
                cid = None
                continue
        kind, raw = hostile.frame(rng, list(lb.task_ids))
        report.frames += 1
        report.kinds[kind] += 1
        try:
            msg = m.decode(raw, max_bytes=limit)
        except ProtocolError as exc:
            report.closes[exc.close_code] += 1
            lb._core(core.disconnect(cid, now, f"closed: {exc.code.name}"))
            cid = None
            continue
        except Exception as exc:  # the decoder must only ever raise ProtocolError
            report.crashes.append((kind, raw, f"decode: {type(exc).__name__}: {exc}"))
            cid = None
            continue
        try:
            lb._core(core.receive(cid, msg, now, nbytes=len(raw)))
        except Exception as exc:  # nothing a peer sends may raise out of the core
            report.crashes.append((kind, raw, f"core: {type(exc).__name__}: {exc}"))
            cid = None
            continue
        if _closed(lb, cid, report):
            cid = None
    lb.run(until=lb.now + 1.0)
    report.honest_accepted = lb.accepted
    return report


def _closed(lb: _Loop, cid: str, report: FuzzReport) -> bool:
    hit = [code for c, code in lb.closed if c == cid]
    lb.closed = [x for x in lb.closed if x[0] != cid]
    for code in hit:
        report.closes[code] += 1
    return bool(hit)


def summary(report: FuzzReport) -> dict[str, Any]:
    return {
        "frames": report.frames,
        "connections": report.connections,
        "kinds": dict(report.kinds),
        "closes": {str(k): v for k, v in sorted(report.closes.items())},
        "undocumented_closes": report.undocumented_closes,
        "crashes": len(report.crashes),
        "first_crash": report.crashes[0][2] if report.crashes else None,
        "honest_accepted": report.honest_accepted,
    }
