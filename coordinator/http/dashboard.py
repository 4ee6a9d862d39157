"""What the operator's dashboard shows beyond /api/status: one row per client and
the recent events, plus an estimate of the time left (``/dashboard``).

Theory of operation. ``Dashboard`` is a sink of the core's outputs (core thread):
it folds each event into its client's row and keeps the notable ones (rejections,
lease expiries, declines, joins and leaves, checkpoints, the end: every one) in a
bounded list with increasing ids, so a stream can send only what is new.
Evaluations come up to ~18 a second and the tiles and charts already show each
one, so one is a line only when it moved accuracy (``EVAL_RISE`` up or
``EVAL_FALL`` down from the last line's) and ``EVAL_GAP_S`` passed since that
line; the first one always is. Reads (``snapshot``) come from the network
thread; every structure is only appended to or replaced whole, and a snapshot
copies what it returns.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from coordinator.core import events as ev
from coordinator.http.metrics import client_kind

#: rows kept for clients that left (the newest), and events kept
MAX_GONE = 256
MAX_EVENTS = 500
#: an evaluation is a line when accuracy rose this much (or fell this much) since
#: the last evaluation line, and at least EVAL_GAP_S seconds after it
EVAL_RISE = 0.01
EVAL_FALL = 0.05
EVAL_GAP_S = 10.0


@dataclass(slots=True)
class ClientRow:
    client_id: str
    name: str
    kind: str
    joined: float
    connected: bool = True
    left: float | None = None
    left_reason: str = ""
    tasks: int = 0
    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    #: results sent again after a reconnect and taken already: not refusals
    resent: int = 0
    declined: int = 0
    expired: int = 0
    bytes_down: int = 0
    bytes_up: int = 0
    staleness_sum: int = 0
    resumed: int = 0

    def bytes_per_hour(self, now: float) -> float | None:
        """Both directions' bytes per hour connected: what lending this client's
        machine costs its owner's link (None in its first minute: too noisy)."""
        span = (self.left if self.left is not None else now) - self.joined
        if span < 60.0:
            return None
        return (self.bytes_down + self.bytes_up) * 3600.0 / span

    def to_json(self, flops: float | None, now: float | None = None) -> dict[str, Any]:
        return {
            "client_id": self.client_id,
            "name": self.name,
            "kind": self.kind,
            "connected": self.connected,
            "joined": self.joined,
            "left": self.left,
            "left_reason": self.left_reason,
            "flops": flops,
            "tasks": self.tasks,
            "accepted": self.accepted,
            "rejected": dict(self.rejected),
            "resent": self.resent,
            "declined": self.declined,
            "expired": self.expired,
            "bytes_down": self.bytes_down,
            "bytes_up": self.bytes_up,
            "bytes_per_hour": None if now is None else self.bytes_per_hour(now),
            "mean_staleness": (
                round(self.staleness_sum / self.accepted, 2) if self.accepted else None
            ),
            "resumed": self.resumed,
        }


class Dashboard:
    """Client rows and recent events; see the module docstring."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.rows: OrderedDict[str, ClientRow] = OrderedDict()
        self.events: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS)
        self._ids = itertools.count(1)
        #: the last evaluation written as a line: (time, version, accuracy)
        self._eval_line: tuple[float, int, float] | None = None
        self._evals_unsaid = 0  # evaluations since that line

    def note(self, kind: str, text: str) -> None:
        """An event the network side saw (a slow consumer closed, say)."""
        self.events.append({"id": next(self._ids), "t": self.clock(), "kind": kind, "text": text})

    def __call__(self, outputs: list[ev.Output]) -> None:
        rows = self.rows
        for o in outputs:
            match o:
                case ev.ClientJoined():
                    row = rows.get(o.client_id)
                    if row is None or not o.resumed:
                        kind = client_kind(o.name, o.platform)
                        row = ClientRow(o.client_id, o.name, kind, self.clock())
                    else:
                        row.resumed += 1
                    row.connected, row.left = True, None
                    rows[o.client_id] = row
                    rows.move_to_end(o.client_id)
                    again = " (resumed)" if o.resumed else ""
                    self.note("join", f"{o.name} joined as {o.client_id}{again}")
                case ev.ClientLeft():
                    row = rows.get(o.client_id)
                    if row is not None:
                        row.connected, row.left, row.left_reason = False, self.clock(), o.reason
                        self.note("leave", f"{row.name} ({o.client_id}) left: {o.reason}")
                    self._evict()
                case ev.TaskLeased():
                    if (row := rows.get(o.client_id)) is not None:
                        row.tasks += 1
                        row.bytes_down += o.download_bytes
                case ev.DataServed():
                    if (row := rows.get(o.client_id)) is not None:
                        row.bytes_down += o.frame_bytes  # its link carried the shard too
                case ev.ResultAccepted():
                    if (row := rows.get(o.client_id)) is not None:
                        row.accepted += 1
                        row.bytes_up += o.frame_bytes
                        row.staleness_sum += o.staleness
                case ev.ResultRejected(resent=True):
                    if (row := rows.get(o.client_id)) is not None:
                        row.resent += 1
                    self.note("duplicate", f"task {o.task_id} from {o.client_id}: "
                              "sent again, taken already (duplicate)")  # fmt: skip
                case ev.ResultRejected():
                    if (row := rows.get(o.client_id)) is not None:
                        row.rejected[o.reason] = row.rejected.get(o.reason, 0) + 1
                    self.note("rejected", f"task {o.task_id} from {o.client_id}: {o.reason}")
                case ev.LeaseExpired():
                    if (row := rows.get(o.client_id)) is not None:
                        row.expired += 1
                    again = ", reissued" if o.reissued else ""
                    self.note("expired", f"task {o.task_id} of {o.client_id}: lease expired{again}")
                case ev.TaskDeclined():
                    if (row := rows.get(o.client_id)) is not None:
                        row.declined += 1
                    self.note("declined", f"task {o.task_id} declined by {o.client_id}: {o.reason}")
                case ev.Evaluated():
                    self._evaluated(o)
                case ev.Checkpoint():
                    self.note("checkpoint", f"checkpoint of v{o.version} requested")
                case ev.JobFinished():
                    acc = "" if o.accuracy is None else f", accuracy {o.accuracy:.4f}"
                    self.note("finished", f"job finished at v{o.version}: {o.reason}{acc}")
                case _:
                    pass

    def _evaluated(self, o: ev.Evaluated) -> None:
        """A line for the first evaluation and for one that moved accuracy (see the
        module docstring); the others are only counted, and the next line says how
        many it stands for."""
        now, last = self.clock(), self._eval_line
        if last is None:
            text = f"v{o.version}: accuracy {o.accuracy:.4f}, loss {o.loss:.4f} (first evaluation)"
        else:
            t, version, accuracy = last
            moved = o.accuracy - accuracy
            if now - t < EVAL_GAP_S or -EVAL_FALL < moved < EVAL_RISE:
                self._evals_unsaid += 1
                return
            n = self._evals_unsaid + 1
            text = (
                f"v{o.version}: accuracy {o.accuracy:.4f} ({moved:+.4f} since v{version}, "
                f"{n} evaluation{'s' if n > 1 else ''}), loss {o.loss:.4f}"
            )
        self._eval_line, self._evals_unsaid = (now, o.version, o.accuracy), 0
        self.note("evaluated", text)

    def _evict(self) -> None:
        gone = [cid for cid, r in self.rows.items() if not r.connected]
        for cid in gone[: max(0, len(gone) - MAX_GONE)]:
            del self.rows[cid]

    def snapshot(self, flops_of: Callable[[str], float | None], since_event: int = 0) -> dict:
        rows = list(self.rows.values())
        now = self.clock()
        return {
            "clients": [r.to_json(flops_of(r.client_id), now) for r in rows],
            "events": [e for e in list(self.events) if e["id"] > since_event],
        }


def estimate_left(
    *,
    now: float,
    started: float,
    version: int,
    max_versions: int | None,
    max_time_s: float | None,
    target_accuracy: float | None,
    evaluations: Sequence[Sequence[float]],
    versions_per_s: float,
) -> dict[str, Any]:
    """Seconds until the job stops, by whichever bound comes first: the version
    budget at the recent pace, the time budget, or the accuracy target at the
    recent evaluations' slope (a straight line through the last few; None while
    it does not climb). ``evaluations``: rows of (wall t, version, accuracy, loss)."""
    guesses: dict[str, float] = {}
    if max_versions is not None and versions_per_s > 0:
        guesses["max_versions"] = max(0.0, (max_versions - version) / versions_per_s)
    if max_time_s is not None:
        guesses["max_time"] = max(0.0, max_time_s - (now - started))
    recent = [e for e in evaluations[-6:] if len(e) >= 3]
    if target_accuracy is not None and len(recent) >= 2:
        ts = [e[0] for e in recent]
        accs = [e[2] for e in recent]
        mt, ma = sum(ts) / len(ts), sum(accs) / len(accs)
        var = sum((t - mt) ** 2 for t in ts)
        slope = sum((t - mt) * (a - ma) for t, a in zip(ts, accs, strict=True)) / var if var else 0
        if accs[-1] >= target_accuracy:
            guesses["target_accuracy"] = 0.0
        elif slope > 0:
            guesses["target_accuracy"] = (target_accuracy - accs[-1]) / slope
    if not guesses:
        return {"seconds": None, "by": None}
    by = min(guesses, key=guesses.__getitem__)
    s = guesses[by]
    return {"seconds": None if math.isinf(s) else round(s, 1), "by": by}
