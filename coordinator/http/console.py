"""What the coordinator's console says: joins, leaves, evaluations, checkpoints,
rejections and the end, at a rate a person can read.

Theory of operation. ``ConsoleLog`` is a sink of the core's outputs (called on
the core thread, like the dashboard). Rare, telling events (the job's end) are
always said. Events that can come in floods (a join, a leave, a rejection, an
evaluation, a checkpoint) are said one by one while they are few: each kind may
spend ``burst`` lines per ``interval`` seconds. Past that they are only counted,
and the counts come out as one line per interval ("12 joined, 3 left; 2 results
rejected (norm 2); ..."), so 700 players joining at once print a handful of
lines, not 700. A progress line (version, clients, results/s, the newest
evaluation) comes every ``interval`` while results arrive.

The sink never reads a socket and writes through ``emit`` (the CLI prints; the
default logs at INFO), so it is as cheap on the core thread as its lines are few.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

from coordinator.core import events as ev

log = logging.getLogger(__name__)

#: Kinds of events that are rate-limited, each with its own line budget.
KINDS = ("join", "leave", "rejected", "evaluated", "checkpoint")


class ConsoleLog:
    """Readable console lines from the core's outputs; see the module docstring."""

    def __init__(
        self,
        emit: Callable[[str], None] | None = None,
        *,
        interval: float = 10.0,
        burst: int = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval > 0 or burst < 0:
            raise ValueError(
                f"console log: need interval > 0 and burst >= 0, got {interval}, {burst}"
            )
        self.emit = emit or log.info
        self.interval = interval
        self.burst = burst
        self.clock = clock
        self._names: dict[str, str] = {}  # of the clients connected now
        self._connected: set[str] = set()
        self._window_start = clock()
        self._spent: Counter[str] = Counter()
        self._held: Counter[str] = Counter()  # events counted, not said, this window
        self._reasons: Counter[str] = Counter()  # of held rejections
        self._accepted = 0  # results accepted this window
        self._busy_since = 0.0  # when the window's first result came (idle time is no rate)
        self._version = 0
        self._eval: ev.Evaluated | None = None  # the newest, said or not
        self._eval_said = True
        self._checkpointed = -1  # a final checkpoint of a version already said is not news
        self.first_result_at: float | None = None

    # -- the sink --------------------------------------------------------------------

    def __call__(self, outputs: list[ev.Output]) -> None:
        now = self.clock()
        for o in outputs:
            match o:
                case ev.ClientJoined():
                    self._names[o.client_id] = o.name
                    self._connected.add(o.client_id)
                    again = " again (resumed its session)" if o.resumed else ""
                    self._say("join", f"{o.name} joined{again}; {len(self._connected)} connected")
                case ev.ClientLeft():
                    self._connected.discard(o.client_id)
                    # forgotten as it leaves: a crowd of strangers churns through ids
                    name = self._names.pop(o.client_id, o.client_id)
                    self._say(
                        "leave", f"{name} left ({o.reason}); {len(self._connected)} connected"
                    )
                case ev.ResultAccepted():
                    if not self._accepted:
                        self._busy_since = now
                    self._accepted += 1
                    if self.first_result_at is None:
                        self.first_result_at = now
                        name = self._names.get(o.client_id, o.client_id)
                        self.emit(f"first result accepted, from {name}")
                case ev.ResultRejected():
                    name = self._names.get(o.client_id, o.client_id)
                    said = (  # a resend after a reconnect is no fault of the client's
                        f"a result {name} sent again was taken already (duplicate)"
                        if o.resent
                        else f"rejected a result from {name}: {o.reason}"
                    )
                    if not self._say("rejected", said):
                        self._reasons[o.reason] += 1
                case ev.ModelUpdated():
                    self._version = o.version
                case ev.Evaluated():
                    self._eval = o
                    self._eval_said = self._say(
                        "evaluated",
                        f"model v{o.version}: test accuracy {o.accuracy:.4f}, loss {o.loss:.4f}",
                    )
                case ev.Checkpoint() if o.version != self._checkpointed:
                    self._checkpointed = o.version
                    self._say("checkpoint", f"checkpoint of model v{o.version}")
                case ev.JobFinished():
                    self.flush()
                    acc = "" if o.accuracy is None else f", test accuracy {o.accuracy:.4f}"
                    self.emit(f"job finished ({o.reason}) at model v{o.version}{acc}")
                case _:
                    pass
        if now - self._window_start >= self.interval:
            self.flush(now)

    def _say(self, kind: str, text: str) -> bool:
        """Say ``text`` if ``kind`` has lines left in this window; else count it."""
        if self._spent[kind] < self.burst:
            self._spent[kind] += 1
            self.emit(text)
            return True
        self._held[kind] += 1
        return False

    # -- the interval's summary --------------------------------------------------------

    def flush(self, now: float | None = None) -> None:
        """Say what was only counted, and the progress line; start a new window."""
        now = self.clock() if now is None else now
        line = self.summary(now)
        if line:
            self.emit(line)
        self._window_start = now
        self._spent.clear()
        self._held.clear()
        self._reasons.clear()
        self._accepted = 0

    def summary(self, now: float) -> str:
        """The window's line: counts of what went unsaid, then progress; '' if quiet."""
        held, parts = self._held, []
        if held["join"] or held["leave"]:
            parts.append(
                f"{held['join']} more joined, {held['leave']} more left; "
                f"{len(self._connected)} connected"
            )
        if held["rejected"]:
            why = ", ".join(f"{r} {n}" for r, n in self._reasons.most_common())
            parts.append(f"{held['rejected']} more results rejected ({why})")
        if held["checkpoint"]:
            parts.append(f"{held['checkpoint']} more checkpoints")
        took = now - self._busy_since
        if self._accepted > 1 and took >= 1.0:  # a rate over less than a second says little
            parts.append(
                f"model v{self._version}, {len(self._connected)} clients, "
                f"{(self._accepted - 1) / took:.1f} results/s"
            )
        if self._eval is not None and not self._eval_said:
            e = self._eval
            parts.append(f"v{e.version}: test accuracy {e.accuracy:.4f}")
            self._eval_said = True
        return "; ".join(parts)
