"""The embedded default ChunkStore: one SQLite file in WAL mode.

A reader never sees a partial checkpoint (WAL's snapshot isolation) and never blocks the
writer; a torn tail of the WAL is ignored on recovery, which the delta log relies on too.
Schema (one file, shared with ``storage.deltalog``)::

    meta(key TEXT PRIMARY KEY, value TEXT)                  schema version
    checkpoints(version INTEGER PRIMARY KEY, created_at, nbytes, n_chunks,
                quarantined, manifest BLOB, manifest_sha256)
    chunks(version, idx, data BLOB, PRIMARY KEY(version, idx))
    chunk_refs(version, idx, owner, PRIMARY KEY(version, idx))   (schema 2)
    deltas(seq INTEGER PRIMARY KEY, result_id UNIQUE, base_version, version,
           weight, meta, data BLOB, crc32)

An incremental checkpoint's unchanged chunks are rows of ``chunk_refs`` naming the version
whose ``chunks`` row holds the bytes (the owner). Deleting a version deletes its own rows
except those another version still refers to, which go with the last reference. Schema 1 (no
references) is upgraded in place when a store is opened for writing. ``synchronous=FULL``
fsyncs the WAL on every commit, so a commit that returned is on disk; ``NORMAL`` is for
benchmarks and stores whose commits acknowledge nothing. Why SQLite and WAL:
docs/decisions.md; the measured cost: docs/operations.md ("The cost of the storage primitives").
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from storage.chunkstore import ChunkStore, Deferred, Inherited, ManifestRecord
from storage.errors import CheckpointExists, StorageError

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
#: schema versions this code reads (1: before incremental checkpoints)
READABLE_SCHEMAS = (1, 2)
SYNCHRONOUS = ("FULL", "NORMAL", "EXTRA")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints (
    version INTEGER PRIMARY KEY,
    created_at REAL NOT NULL,
    nbytes INTEGER NOT NULL,
    n_chunks INTEGER NOT NULL,
    quarantined INTEGER NOT NULL DEFAULT 0,
    manifest BLOB NOT NULL,
    manifest_sha256 TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS chunks (
    version INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (version, idx)
);
CREATE TABLE IF NOT EXISTS chunk_refs (
    version INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    owner INTEGER NOT NULL,
    PRIMARY KEY (version, idx)
);
CREATE INDEX IF NOT EXISTS chunk_refs_owner ON chunk_refs(owner, idx);
CREATE TABLE IF NOT EXISTS deltas (
    seq INTEGER PRIMARY KEY,
    result_id TEXT NOT NULL UNIQUE,
    base_version INTEGER NOT NULL,
    version INTEGER NOT NULL,
    weight REAL NOT NULL,
    meta TEXT NOT NULL,
    data BLOB NOT NULL,
    crc32 INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS deltas_version ON deltas(version);
CREATE TABLE IF NOT EXISTS blobs (sha256 TEXT PRIMARY KEY, data BLOB NOT NULL);
"""


def connect(
    path: str | os.PathLike[str], *, synchronous: str = "FULL", readonly: bool = False
) -> sqlite3.Connection:
    """Open (creating if needed) a store file in WAL mode with the schema in place.

    The connection is in autocommit mode: every transaction is an explicit
    ``BEGIN``…``COMMIT``, so none is left open by accident between calls.
    """
    if synchronous not in SYNCHRONOUS:
        raise ValueError(f"synchronous: expected one of {SYNCHRONOUS}, got {synchronous!r}")
    path = os.fspath(path)
    if readonly and not os.path.exists(path):
        raise StorageError(f"{path}: no such store")
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
        conn.execute("PRAGMA busy_timeout=30000")
        if not readonly:
            # page_size only takes effect on a new, empty file, before WAL is on.
            conn.execute("PRAGMA page_size=65536")
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise StorageError(f"{path}: could not switch to WAL mode (got {mode})")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        # Folding the WAL into the main file is the background WalFolder's job, not
        # every commit's: a commit that acknowledges results pays only its own fsync.
        conn.execute("PRAGMA wal_autocheckpoint=0")
        # Reads through the map skip a copy per page (chunks are read once, whole).
        conn.execute(f"PRAGMA mmap_size={1 << 30}")
        if not readonly:
            conn.executescript(_SCHEMA)
            conn.execute(
                "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
        row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if not readonly and row is not None and row[0] == "1":
            # 1 -> 2 only added chunk_refs, which the script above just created.
            conn.execute(
                "UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),)
            )
            row = (str(SCHEMA_VERSION),)
    except sqlite3.DatabaseError as exc:
        raise StorageError(f"{path}: not a readable crowdgrad store ({exc})") from None
    if row is None or int(row[0]) not in READABLE_SCHEMAS:
        conn.close()
        raise StorageError(
            f"{path}: schema version {row[0] if row else None}, expected one of "
            f"{READABLE_SCHEMAS} (a newer crowdgrad wrote it?)"
        )
    return conn


class WalFolder:
    """Folds the WAL into the main file on a background thread after commits.

    SQLite's own auto-checkpoint runs inside the commit that crosses its threshold,
    so one unlucky delta append would pay for copying a whole model. Here commits
    only ``poke()``; a daemon thread with its own connection runs a PASSIVE
    checkpoint (never blocks readers or writers, crash-safe by SQLite's design) and
    ``close()`` runs a final TRUNCATE one so a cleanly closed store is one file.
    """

    def __init__(self, path: str, synchronous: str) -> None:
        self._path = path
        self._synchronous = synchronous
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="crowdgrad-wal-folder", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        conn = connect(self._path, synchronous=self._synchronous, readonly=True)
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stop:
                    break
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error as exc:  # busy or closing: the next poke retries
                    log.debug("wal checkpoint skipped: %s", exc)
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:
                log.debug("final wal checkpoint skipped: %s", exc)
        finally:
            conn.close()

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join()


class SqliteChunkStore(ChunkStore):
    """ChunkStore on one SQLite file; thread-safe (one connection behind a lock)."""

    def __init__(
        self, path: str | os.PathLike[str], *, synchronous: str = "FULL", readonly: bool = False
    ) -> None:
        self.path = os.fspath(path)
        self._conn = connect(self.path, synchronous=synchronous, readonly=readonly)
        # A schema 1 file opened read-only has no reference table (and needs none).
        self._refs = (
            self._conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='chunk_refs'"
            ).fetchone()
            is not None
        )
        self._lock = threading.RLock()
        self._depth = 0
        self._folder = None if readonly else WalFolder(self.path, synchronous)

    # -- writes -------------------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._depth:
                raise StorageError("write inside a snapshot() block; leave the snapshot first")
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
            if self._folder is not None:
                self._folder.poke()

    def commit(
        self,
        version: int,
        chunks: Sequence[Sequence[Any]],
        finish: Callable[[], ManifestRecord],
    ) -> ManifestRecord:
        with self._write() as c:
            (newest,) = c.execute(
                "SELECT max(version) FROM checkpoints WHERE quarantined=0"
            ).fetchone()
            if newest is not None and version <= newest:
                raise CheckpointExists(
                    f"version {version} is not above the newest stored version {newest}"
                )
            stale = [
                v
                for (v,) in c.execute(
                    "SELECT version FROM checkpoints WHERE version>=?", (version,)
                )
            ]
            self._delete_in(c, stale)
            for i, parts in enumerate(chunks):
                if isinstance(parts, Inherited):
                    self._refer(c, version, i, parts.version)
                    continue
                if isinstance(parts, Deferred):
                    parts = parts.read()
                # zeroblob + incremental writes: the parts go straight from the
                # caller's arrays into pages, with no joined temporary.
                n = sum(memoryview(p).nbytes for p in parts)
                cur = c.execute(
                    "INSERT INTO chunks(version, idx, data) VALUES (?, ?, zeroblob(?))",
                    (version, i, n),
                )
                if n:
                    with c.blobopen("chunks", "data", cur.lastrowid) as blob:
                        for p in parts:
                            blob.write(p)
            record = finish()
            if record.version != version or record.n_chunks != len(chunks):
                raise ValueError(
                    f"commit: record (v{record.version}, {record.n_chunks} chunks) does not "
                    f"match the chunks written (v{version}, {len(chunks)})"
                )
            c.execute(
                "INSERT INTO checkpoints(version, created_at, nbytes, n_chunks, quarantined,"
                " manifest, manifest_sha256) VALUES (?, ?, ?, ?, 0, ?, ?)",
                (
                    record.version,
                    record.created_at,
                    record.nbytes,
                    record.n_chunks,
                    record.manifest,
                    record.manifest_sha256,
                ),
            )
        return record

    @staticmethod
    def _refer(c: sqlite3.Connection, version: int, idx: int, owner: int) -> None:
        if owner >= version:
            raise StorageError(f"chunk {idx} of v{version}: inherits from v{owner}, not earlier")
        held = c.execute("SELECT 1 FROM chunks WHERE version=? AND idx=?", (owner, idx)).fetchone()
        if held is None:
            raise StorageError(f"chunk {idx} of v{version}: v{owner} holds no such chunk")
        c.execute(
            "INSERT INTO chunk_refs(version, idx, owner) VALUES (?, ?, ?)", (version, idx, owner)
        )

    def _delete_in(self, c: sqlite3.Connection, versions: Sequence[int]) -> None:
        owners: set[int] = set(versions)
        for v in versions:
            if self._refs:
                owners.update(
                    o for (o,) in c.execute(
                        "SELECT DISTINCT owner FROM chunk_refs WHERE version=?", (v,)
                    )
                )  # fmt: skip
                c.execute("DELETE FROM chunk_refs WHERE version=?", (v,))
            c.execute("DELETE FROM checkpoints WHERE version=?", (v,))
        # Rows of versions that are gone, unless a remaining version refers to them.
        for o in owners:
            if c.execute("SELECT 1 FROM checkpoints WHERE version=?", (o,)).fetchone():
                continue
            if not self._refs:
                c.execute("DELETE FROM chunks WHERE version=?", (o,))
                continue
            c.execute(
                "DELETE FROM chunks WHERE version=? AND NOT EXISTS (SELECT 1 FROM chunk_refs r"
                " WHERE r.owner=chunks.version AND r.idx=chunks.idx)",
                (o,),
            )

    def delete(self, versions: Sequence[int]) -> None:
        if not versions:
            return
        with self._write() as c:
            self._delete_in(c, list(versions))

    def quarantine(self, version: int) -> None:
        with self._write() as c:
            c.execute("UPDATE checkpoints SET quarantined=1 WHERE version=?", (version,))

    # -- reads --------------------------------------------------------------------

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            # A deferred transaction takes its WAL snapshot at the first read and
            # keeps it until COMMIT: every read below sees the same state.
            self._conn.execute("BEGIN")
            self._depth = 1
            try:
                yield
            finally:
                self._depth = 0
                self._conn.execute("COMMIT")

    _COLUMNS = "version, created_at, nbytes, n_chunks, quarantined, manifest, manifest_sha256"

    @staticmethod
    def _record(row: tuple) -> ManifestRecord:
        return ManifestRecord(
            version=row[0],
            created_at=row[1],
            nbytes=row[2],
            n_chunks=row[3],
            quarantined=bool(row[4]),
            manifest=bytes(row[5]),
            manifest_sha256=row[6],
        )

    def records(self) -> list[ManifestRecord]:
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {self._COLUMNS} FROM checkpoints ORDER BY version"
            ).fetchall()
        return [self._record(r) for r in rows]

    def record(self, version: int) -> ManifestRecord | None:
        with self._lock:
            row = self._conn.execute(
                f"SELECT {self._COLUMNS} FROM checkpoints WHERE version=?", (version,)
            ).fetchone()
        return None if row is None else self._record(row)

    def iter_chunks(self, version: int) -> Iterator[tuple[int, bytes]]:
        with self._lock:
            own = "SELECT idx, rowid FROM chunks WHERE version=?1"
            if self._refs:
                own += (
                    " UNION ALL SELECT r.idx, c.rowid FROM chunk_refs r JOIN chunks c"
                    " ON c.version=r.owner AND c.idx=r.idx WHERE r.version=?1"
                )
            rows = self._conn.execute(f"{own} ORDER BY 1", (version,)).fetchall()
            for idx, rowid in rows:
                # Incremental blob I/O reads the pages straight into the bytes object.
                with self._conn.blobopen("chunks", "data", rowid, readonly=True) as blob:
                    data = blob.read()
                yield idx, data

    def put_blob(self, sha256: str, data: bytes) -> bool:
        with self._write() as c:
            cur = c.execute(
                "INSERT OR IGNORE INTO blobs (sha256, data) VALUES (?, ?)", (sha256, data)
            )
            return cur.rowcount == 1

    def get_blob(self, sha256: str) -> bytes | None:
        with self._lock:
            row = self._conn.execute("SELECT data FROM blobs WHERE sha256=?", (sha256,)).fetchone()
        return None if row is None else bytes(row[0])

    def get_meta(self, key: str) -> str | None:
        with self._lock:
            row = self._conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        if key == "schema_version":
            raise StorageError("meta: schema_version is the store's own")
        with self._write() as c:
            c.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    def backup(self, dest: str | os.PathLike[str]) -> None:
        """A consistent copy of the whole store (WAL included) in a new file ``dest``,
        by SQLite's online backup: readers and the writer carry on meanwhile."""
        if os.path.exists(dest):
            raise StorageError(f"backup: {os.fspath(dest)} exists")
        target = sqlite3.connect(os.fspath(dest))
        try:
            with self._lock:
                self._conn.backup(target)
        except sqlite3.Error as exc:
            target.close()
            with contextlib.suppress(OSError):
                os.remove(dest)
            raise StorageError(f"backup to {os.fspath(dest)}: {exc}") from exc
        target.close()

    def wal_checkpoint(self) -> None:
        """Fold the WAL into the main file and truncate it (for backups and tests)."""
        with self._lock:
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        with self._lock:
            self._conn.close()
        if self._folder is not None:
            self._folder.close()
            self._folder = None
