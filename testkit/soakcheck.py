"""What a soak knows and how it checks it: the wire ledger and the store check.

``Ledger`` is the proxy's tap: it records, per connection, the client's name
(from its ``hello``), each ``welcome`` and each ``ack`` the coordinator sent.
An acknowledgement *was given* when the proxy read a whole ``ack`` frame with
``accepted: true`` or reason ``duplicate`` from the coordinator's side of a
connection (docs/operations.md, "Durability": both promise the result is in
the model); it counts whether or not the proxy then delivered it.

``check_store`` says whether a set of acknowledged task ids is in what a
restarted coordinator restores from a store: the newest checkpoint that
verifies, its ``applied_results``, plus the journal's run of merges that follows
it (``Coordinator.replay`` applies exactly that run). Call it only while no
coordinator holds the store (after a kill -9, before the restart).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coordinator.runtime.journal import journal_path
from storage import CheckpointStore, DeltaLog


@dataclass(frozen=True, slots=True)
class WireEvent:
    t: float  # time.monotonic()
    conn: int
    client: str  # the hello's name, "" before one was seen
    kind: str  # welcome | ack
    task_id: str = ""
    accepted: bool = False
    reason: str = ""

    @property
    def promises(self) -> bool:
        """An ack saying the result is in the model (accepted, or a duplicate)."""
        return self.kind == "ack" and (self.accepted or self.reason == "duplicate")


@dataclass(slots=True)
class Ledger:
    """Thread-safe: the proxy's loop writes, the soak reads."""

    events: list[WireEvent] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, conn: int, way: str, message: dict[str, Any]) -> None:
        kind, now = message.get("type"), time.monotonic()
        with self._lock:
            if way == "up":
                if kind == "hello" and isinstance(message.get("client"), str):
                    self.names[conn] = message["client"]
                return
            name = self.names.get(conn, "")
            if kind == "welcome":
                self.events.append(WireEvent(now, conn, name, "welcome"))
            elif kind == "ack":
                self.events.append(
                    WireEvent(
                        now,
                        conn,
                        name,
                        "ack",
                        task_id=str(message.get("task_id", "")),
                        accepted=message.get("accepted") is True,
                        reason=str(message.get("reason", "")),
                    )
                )

    def since(self, index: int) -> tuple[list[WireEvent], int]:
        """Events from ``index`` on, and the index to ask from next time."""
        with self._lock:
            return self.events[index:], len(self.events)

    def snapshot(self) -> list[WireEvent]:
        with self._lock:
            return list(self.events)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreCheck:
    version: int  # what a restart resumes from (-1: nothing stored yet)
    checkpoint_version: int
    journaled: int  # merges replayed on top of the checkpoint
    checked: int  # acknowledged ids checked
    lost: tuple[str, ...]  # acknowledged, yet not in what a restart restores
    corrupt: tuple[str, ...]  # checkpoints that did not verify


def check_store(store: Path, acked: set[str]) -> StoreCheck:
    applied: set[str] = set()
    version = checkpoint = -1
    corrupt: tuple[str, ...] = ()
    if store.exists():
        with CheckpointStore.open(store) as s:
            corrupt = tuple(f"v{r.version}: {r.reason}" for r in s.verify() if not r.ok)
            if s.versions():
                ckpt = s.load_latest(quarantine=False)
                applied.update(str(t) for t in ckpt.applied_results)
                version = checkpoint = ckpt.version
    journaled = 0
    journal = journal_path(store)
    if journal.exists():
        log = DeltaLog(journal)
        try:
            for entry in log.replay(after_version=max(version, 0)):
                if entry.version != max(version, 0) + 1:
                    break  # replay stops at a version the log does not hold
                applied.add(str(entry.result_id))
                version, journaled = entry.version, journaled + 1
        finally:
            log.close()
    lost = tuple(sorted(acked - applied, key=lambda t: (len(t), t)))
    return StoreCheck(
        version=version,
        checkpoint_version=checkpoint,
        journaled=journaled,
        checked=len(acked),
        lost=lost,
        corrupt=corrupt,
    )


def rss_mb(pid: int) -> float | None:
    """Resident set size of a live process from /proc (None once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def slope_mb_per_min(samples: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MB) samples, in MB a minute."""
    if len(samples) < 3:
        return None
    n = len(samples)
    mt = sum(t for t, _ in samples) / n
    mr = sum(r for _, r in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    if var == 0:
        return None
    return 60 * sum((t - mt) * (r - mr) for t, r in samples) / var
