"""DeltaLog: the write-ahead log of accepted deltas that makes an acknowledgement true.

Theory of operation. The coordinator may acknowledge a result only once it is
durable. Folding every result into a checkpoint would write the whole model per
result; instead each accepted delta is appended here, and ``append`` returns
only after the transaction is fsynced (``synchronous=FULL``). A batch of entries
is one transaction and one fsync: that is the group commit, and the driver gets
it by appending every result that arrived while the previous append was in
flight as one batch.

On restart: ``load_latest()`` gives version V, then ``replay(after_version=V)``
yields every logged delta newer than V in append order. Once a checkpoint at V
is committed, ``truncate(V)`` drops what it covers (replay would skip them
anyway, so a crash between the two is harmless).

The log is a table in the same SQLite file as the checkpoints: one file to back
up, and a torn tail (a crash mid-append) is a WAL frame whose checksum fails, so
SQLite recovery discards that whole transaction — none of its entries had been
acknowledged. Each entry also carries a crc32 of its delta bytes, so damage at
rest is reported (``CorruptDeltaLog``) instead of silently applied.
"""

from __future__ import annotations

import json
import os
import threading
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from storage.errors import CorruptDeltaLog
from storage.sqlite import WalFolder, connect


@dataclass(frozen=True, slots=True, kw_only=True)
class DeltaEntry:
    """One accepted result: ``model[version] = model[base_version..] + weight * delta``.

    ``delta`` is a flat float32 array (the whole model, or whatever slice ``meta``
    names, for example a neuron group); ``meta`` is any JSON-able dict. Or, with
    ``delta`` empty, ``payload`` holds the delta in a form of the caller's (its
    encoded wire frames), stored and returned as the same bytes.
    """

    result_id: str
    base_version: int
    version: int
    weight: float
    delta: np.ndarray
    meta: Mapping[str, Any] = field(default_factory=dict)
    payload: bytes | None = None

    def __post_init__(self) -> None:
        d = self.delta
        if not isinstance(d, np.ndarray) or d.dtype != np.float32 or d.ndim != 1:
            raise ValueError(f"delta entry {self.result_id!r}: delta must be a 1-D float32 array")
        if self.payload is not None and d.size:
            raise ValueError(f"delta entry {self.result_id!r}: a payload or a delta, not both")
        if not self.result_id:
            raise ValueError("delta entry: result_id must be a non-empty string")
        if _PAYLOAD in self.meta:
            raise ValueError(f"delta entry {self.result_id!r}: meta key {_PAYLOAD!r} is reserved")

    @property
    def nbytes(self) -> int:
        """The bytes the entry's data takes in the log."""
        return len(self.payload) if self.payload is not None else self.delta.nbytes


#: meta key the log adds to an entry stored as a payload (read back as one)
_PAYLOAD = "_payload"
_EMPTY = np.empty(0, dtype=np.float32)


class DeltaLog:
    """Append-only log of accepted deltas in a store file; thread-safe."""

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str = "FULL") -> None:
        self.path = os.fspath(path)
        self._conn = connect(self.path, synchronous=synchronous)
        self._lock = threading.Lock()
        self._folder = WalFolder(self.path, synchronous)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
        self._folder.close()

    def __enter__(self) -> DeltaLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def append(self, entries: Iterable[DeltaEntry]) -> int:
        """Durably log ``entries`` in one transaction (one fsync); returns how many were new.

        A result id already logged is skipped, so re-appending after an uncertain
        crash is safe. When this returns, every entry may be acknowledged.
        """
        rows = []
        for e in entries:
            meta = dict(e.meta)
            if e.payload is not None:
                meta[_PAYLOAD] = True
                data: Any = e.payload
            else:
                data = memoryview(np.ascontiguousarray(e.delta)).cast("B")
            rows.append(
                (
                    e.result_id,
                    e.base_version,
                    e.version,
                    float(e.weight),
                    json.dumps(meta, separators=(",", ":")),
                    data,
                    zlib.crc32(data),
                )
            )
        if not rows:
            return 0
        with self._lock:
            c = self._conn
            before = c.total_changes
            c.execute("BEGIN IMMEDIATE")
            try:
                c.executemany(
                    "INSERT OR IGNORE INTO deltas(result_id, base_version, version, weight,"
                    " meta, data, crc32) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )
            except BaseException:
                c.execute("ROLLBACK")
                raise
            c.execute("COMMIT")
            self._folder.poke()
            return c.total_changes - before

    def replay(self, after_version: int = -1) -> Iterator[DeltaEntry]:
        """Entries whose resulting ``version`` is above ``after_version``, in append
        order, read one at a time (a long log of big deltas never sits in memory)."""
        with self._lock:
            seqs = [
                s
                for (s,) in self._conn.execute(
                    "SELECT seq FROM deltas WHERE version>? ORDER BY seq", (after_version,)
                )
            ]
        for seq in seqs:
            with self._lock:
                row = self._conn.execute(
                    "SELECT result_id, base_version, version, weight, meta, data, crc32"
                    " FROM deltas WHERE seq=?",
                    (seq,),
                ).fetchone()
            if row is None:  # truncated meanwhile
                continue
            rid, base, version, weight, meta, data, crc = row
            if zlib.crc32(data) != crc:
                raise CorruptDeltaLog(f"delta log entry {seq} (result {rid!r}): crc32 mismatch")
            meta = json.loads(meta)
            if meta.pop(_PAYLOAD, False):
                delta, payload = _EMPTY, bytes(data)
            elif len(data) % 4:
                raise CorruptDeltaLog(f"delta log entry {seq} (result {rid!r}): torn delta")
            else:
                delta, payload = np.frombuffer(data, dtype=np.float32), None
            yield DeltaEntry(
                result_id=rid,
                base_version=base,
                version=version,
                weight=weight,
                delta=delta,
                meta=meta,
                payload=payload,
            )

    def result_ids(self, after_version: int = -1) -> list[str]:
        """Logged result ids newer than ``after_version`` without reading the deltas."""
        with self._lock:
            return [
                r
                for (r,) in self._conn.execute(
                    "SELECT result_id FROM deltas WHERE version>? ORDER BY seq", (after_version,)
                )
            ]

    def truncate(self, upto_version: int) -> int:
        """Drop entries a committed checkpoint at ``upto_version`` covers; returns how many."""
        with self._lock:
            c = self._conn
            before = c.total_changes
            c.execute("BEGIN IMMEDIATE")
            c.execute("DELETE FROM deltas WHERE version<=?", (upto_version,))
            c.execute("COMMIT")
            self._folder.poke()
            return c.total_changes - before

    def __len__(self) -> int:
        with self._lock:
            return self._conn.execute("SELECT count(*) FROM deltas").fetchone()[0]
