"""The discrete-event engine: a virtual clock and a heap of keyed events.

Theory of operation. Every event is keyed ``(time, priority, sequence)`` and the
engine always runs the smallest key next. The ordering rules, which the tests
pin down, are:

1. An earlier ``time`` runs first. Time never goes backwards: scheduling in the
   past is a programming error.
2. At equal time, a lower ``priority`` runs first (see :class:`Priority`: a drop
   is decided before a frame lands, a frame lands before a computation ends, and
   the coordinator's ``tick`` sees everything that happened at that instant).
3. At equal time and priority, events run in the order they were scheduled
   (``sequence`` is a counter), so ties never depend on hashing or on ids.

Nothing here reads the wall clock or the global random state. Randomness comes
from :meth:`Engine.rng`: one ``np.random.Generator`` per named stream, seeded by
``SeedSequence(seed, spawn_key=hash(name))`` with a stable hash, so a stream's
draws depend only on the scenario seed and the stream's name. Adding a client
adds streams; it never shifts the draws of the others.
"""

from __future__ import annotations

import enum
import hashlib
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class Priority(enum.IntEnum):
    """Tie-break at equal virtual time; lower runs first."""

    CHURN = 0  # a client leaves or joins: decided before anything lands
    DELIVERY = 10  # a frame arrives at its receiver
    COMPUTE = 20  # a client's computation finishes
    TICK = 30  # the coordinator's periodic tick
    CONTROL = 40  # stop conditions, sampling of metrics


@dataclass(eq=False, slots=True)
class Event:
    """A scheduled callback; hold it to cancel it. Identity is the handle."""

    time: float
    priority: int
    sequence: int
    callback: Callable[..., Any]
    args: tuple[Any, ...] = field(default=())
    cancelled: bool = False

    def key(self) -> tuple[float, int, int]:
        return (self.time, self.priority, self.sequence)

    def __lt__(self, other: Event) -> bool:
        return self.key() < other.key()


class EngineError(RuntimeError):
    """The engine was misused: scheduling in the past, a non-finite time."""


def stream_seed(seed: int, name: str) -> np.random.SeedSequence:
    """The SeedSequence for stream ``name``: a stable digest, never ``hash()``."""
    digest = hashlib.blake2b(name.encode(), digest_size=16).digest()
    words = tuple(int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4))
    return np.random.SeedSequence(int(seed), spawn_key=words)


class Engine:
    """Virtual clock plus event heap; see the module docstring for ordering."""

    def __init__(self, *, seed: int = 0, start: float = 0.0) -> None:
        if seed < 0:
            raise EngineError(f"seed must be >= 0, got {seed}")
        self.seed = int(seed)
        self._now = float(start)
        # (time, priority, sequence, event): tuples compare in C, unique by sequence
        self._heap: list[tuple[float, int, int, Event]] = []
        self._sequence = 0
        self._streams: dict[str, np.random.Generator] = {}
        self.events_run = 0

    @property
    def now(self) -> float:
        return self._now

    def rng(self, name: str) -> np.random.Generator:
        """The generator of stream ``name``, created on first use."""
        gen = self._streams.get(name)
        if gen is None:
            gen = np.random.default_rng(stream_seed(self.seed, name))
            self._streams[name] = gen
        return gen

    def schedule(
        self,
        delay: float,
        callback: Callable[..., Any],
        *args: Any,
        priority: int = Priority.CONTROL,
    ) -> Event:
        """Run ``callback(*args)`` ``delay`` seconds from now."""
        return self.schedule_at(self._now + delay, callback, *args, priority=priority)

    def schedule_at(
        self,
        time: float,
        callback: Callable[..., Any],
        *args: Any,
        priority: int = Priority.CONTROL,
    ) -> Event:
        """Run ``callback(*args)`` at virtual ``time`` (>= now)."""
        if not math.isfinite(time):
            raise EngineError(f"event time must be finite, got {time}")
        if time < self._now:
            raise EngineError(f"cannot schedule at {time} before now ({self._now})")
        ev = Event(float(time), int(priority), self._sequence, callback, args)
        self._sequence += 1
        heapq.heappush(self._heap, (ev.time, ev.priority, ev.sequence, ev))
        return ev

    @staticmethod
    def cancel(event: Event | None) -> None:
        """Cancel a pending event; cancelling twice or after it ran is harmless."""
        if event is not None:
            event.cancelled = True

    def peek_time(self) -> float | None:
        """Time of the next live event, or None when nothing is pending."""
        self._drop_cancelled()
        return self._heap[0][0] if self._heap else None

    def _drop_cancelled(self) -> None:
        heap = self._heap
        while heap and heap[0][3].cancelled:
            heapq.heappop(heap)

    def step(self) -> bool:
        """Run the next live event; False when none is left."""
        before = self.events_run
        self.run_until(max_events=1)
        return self.events_run > before

    def run_until(
        self,
        time: float | None = None,
        *,
        until: Callable[[], bool] | None = None,
        max_events: int | None = None,
    ) -> float:
        """Run events until ``time``, until ``until()`` is true, or the heap empties.

        Events at exactly ``time`` run; afterwards the clock stands at ``time``
        (when given and not stopped earlier by ``until``). ``until`` is checked
        before the first event and after every event. Returns the clock.
        """
        # The one place events run (step() comes here too); peek_time() and
        # _drop_cancelled() inlined: this loop runs once per event of every simulation
        heap, pop = self._heap, heapq.heappop
        horizon = math.inf if time is None else time
        ran = 0
        while True:
            if until is not None and until():
                return self._now
            if max_events is not None and ran >= max_events:
                return self._now
            while heap and heap[0][3].cancelled:
                pop(heap)
            if not heap or heap[0][0] > horizon:
                break
            ev = pop(heap)[3]
            self._now = ev.time
            ev.cancelled = True  # a handle of a run event cancels as a no-op
            self.events_run += 1
            ev.callback(*ev.args)
            ran += 1
        if time is not None and time > self._now:
            self._now = float(time)
        return self._now

    def pending(self) -> int:
        """Live events still queued."""
        return sum(1 for item in self._heap if not item[3].cancelled)
