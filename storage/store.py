"""CheckpointStore: versioned, checksummed, atomically visible checkpoints.

Call-order contract for a coordinator: ``open`` → ``load_latest`` (restore) →
``save`` every N versions and on shutdown → ``prune`` after a save → ``close``.
Loading verifies every chunk; a corrupt newest checkpoint is logged, quarantined
(kept for inspection, never loaded again) and the previous valid one is used.
"""

from __future__ import annotations

import builtins
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from storage.chunkstore import ChunkStore, ManifestRecord
from storage.errors import CorruptCheckpoint, NoCheckpoint
from storage.layout import Checkpoint, decode, encode, parse_manifest, seal, sha256_hex
from storage.limits import StoreLimits, WriteBudget
from storage.retention import RetentionPolicy
from storage.sqlite import SqliteChunkStore

log = logging.getLogger(__name__)

#: Below this many bytes a checkpoint is hashed inline; a thread pool costs more.
_POOL_MIN_BYTES = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointInfo:
    """What ``list`` shows without reading chunks."""

    version: int
    created_at: float
    nbytes: int
    n_chunks: int
    quarantined: bool
    widths: tuple[int, ...]
    metadata: dict[str, Any]
    n_applied: int


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyReport:
    version: int
    ok: bool
    reason: str = ""


def _workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


class CheckpointStore:
    """Checkpoints over a ``ChunkStore``; see the module docstring for the call order."""

    def __init__(self, backend: ChunkStore, *, limits: StoreLimits | None = None) -> None:
        self.backend = backend
        self.limits = limits or StoreLimits()
        self.budget: WriteBudget | None = self.limits.budget()

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        limits: StoreLimits | None = None,
        synchronous: str = "FULL",
        readonly: bool = False,
    ) -> CheckpointStore:
        """The embedded default: one SQLite file (created unless ``readonly``)."""
        return cls(
            SqliteChunkStore(path, synchronous=synchronous, readonly=readonly), limits=limits
        )

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- content-addressed blobs (the job's data shards) ---------------------------

    def put_blob(self, data: bytes) -> str:
        """Keep ``data`` by its sha256 (once: a second put of the same bytes is free)."""
        sha = sha256_hex(data)
        self.backend.put_blob(sha, data)
        return sha

    def get_blob(self, sha256: str) -> bytes | None:
        """The bytes kept under ``sha256``, checked against it (None if absent)."""
        data = self.backend.get_blob(sha256)
        if data is not None and sha256_hex(data) != sha256:
            raise CorruptCheckpoint(f"blob {sha256}: stored bytes do not match their hash")
        return data

    # -- writing ------------------------------------------------------------------

    def write_cost(self, ckpt: Checkpoint) -> int:
        """Writes a save costs against the budget: one per chunk plus the manifest."""
        _, chunks = encode(ckpt, self.limits.max_chunk_bytes)
        return len(chunks) + 1

    def save(self, ckpt: Checkpoint, *, now: float | None = None) -> CheckpointInfo:
        """Store ``ckpt`` atomically; when this returns it is durable and visible.

        ``now`` feeds the write budget (required when ``writes_per_minute`` is
        set; raises ``WriteBudgetExceeded`` with nothing written when spent).
        """
        manifest, chunks = encode(ckpt, self.limits.max_chunk_bytes)
        if self.budget is not None:
            if now is None:
                raise ValueError("save: a writes_per_minute budget needs the caller's `now`")
            self.budget.require(len(chunks) + 1, now)
        nbytes = sum(p.nbytes for c in chunks for p in c)

        def finish(hashes: list) -> ManifestRecord:
            blob, digest = seal(manifest, (h if isinstance(h, str) else h.result() for h in hashes))
            return ManifestRecord(
                version=ckpt.version,
                created_at=float(ckpt.created_at),
                nbytes=nbytes,
                n_chunks=len(chunks),
                quarantined=False,
                manifest=blob,
                manifest_sha256=digest,
            )

        if nbytes >= _POOL_MIN_BYTES and len(chunks) > 1:
            # Hash on worker threads while the backend writes the same chunks.
            with ThreadPoolExecutor(_workers()) as pool:
                futures = [pool.submit(sha256_hex, *c) for c in chunks]
                record = self.backend.commit(ckpt.version, chunks, lambda: finish(futures))
        else:
            hashes = [sha256_hex(*c) for c in chunks]
            record = self.backend.commit(ckpt.version, chunks, lambda: finish(hashes))
        log.info("checkpoint v%d saved: %d chunks, %d bytes", ckpt.version, len(chunks), nbytes)
        return self._info(record, manifest)

    # -- listing ------------------------------------------------------------------

    @staticmethod
    def _info(record: ManifestRecord, manifest: dict | None) -> CheckpointInfo:
        m = manifest or {}
        return CheckpointInfo(
            version=record.version,
            created_at=record.created_at,
            nbytes=record.nbytes,
            n_chunks=record.n_chunks,
            quarantined=record.quarantined,
            widths=tuple(m.get("spec", {}).get("widths", ())),
            metadata=dict(m.get("metadata", {})),
            n_applied=len(m.get("applied_results", ())),
        )

    def list(self) -> builtins.list[CheckpointInfo]:
        """Every stored checkpoint, ascending; a damaged manifest shows with no widths."""
        out = []
        for r in self.backend.records():
            try:
                m = parse_manifest(r.version, r.manifest, r.manifest_sha256)
            except CorruptCheckpoint:
                m = None
            out.append(self._info(r, m))
        return out

    def versions(self) -> builtins.list[int]:
        return [r.version for r in self.backend.records() if not r.quarantined]

    # -- reading ------------------------------------------------------------------

    def load(self, version: int) -> Checkpoint:
        """One version, every checksum verified; ``CorruptCheckpoint`` if any fails."""
        with self.backend.snapshot():
            record = self.backend.record(version)
            if record is None:
                raise NoCheckpoint(f"no checkpoint v{version} in the store")
            manifest = parse_manifest(version, record.manifest, record.manifest_sha256)
            chunks = self.backend.iter_chunks(version)
            if record.nbytes >= _POOL_MIN_BYTES and record.n_chunks > 1:
                with ThreadPoolExecutor(_workers()) as pool:
                    return decode(version, manifest, chunks, pool)
            return decode(version, manifest, chunks)

    def load_latest(self, *, quarantine: bool = True) -> Checkpoint:
        """The newest checkpoint that verifies, falling back past corrupt ones.

        Each corrupt one is logged as a warning and, with ``quarantine``, marked so
        it is skipped from then on and a new save may reuse its version number.
        """
        for v in reversed(self.versions()):
            try:
                return self.load(v)
            except NoCheckpoint:
                continue  # deleted by a concurrent prune since we listed
            except CorruptCheckpoint as exc:
                log.warning("%s; falling back to the previous checkpoint", exc)
                if quarantine:
                    self.backend.quarantine(v)
        raise NoCheckpoint("no valid checkpoint in the store")

    def verify(self, version: int | None = None) -> builtins.list[VerifyReport]:
        """Check every chunk of one version (or all); never raises on corruption.

        All versions are checked in one snapshot, so a concurrent prune cannot make
        a version vanish between listing and reading it.
        """
        out = []
        with self.backend.snapshot():
            stored = [r.version for r in self.backend.records()]
            versions = stored if version is None else [version]
            for v in versions:
                try:
                    self.load(v)
                    out.append(VerifyReport(version=v, ok=True))
                except CorruptCheckpoint as exc:
                    out.append(VerifyReport(version=v, ok=False, reason=exc.reason))
                except NoCheckpoint as exc:
                    out.append(VerifyReport(version=v, ok=False, reason=str(exc)))
        return out

    # -- housekeeping -------------------------------------------------------------

    def delete(self, version: int) -> None:
        if self.backend.record(version) is None:
            raise NoCheckpoint(f"no checkpoint v{version} in the store")
        self.backend.delete([version])

    def prune(self, policy: RetentionPolicy) -> builtins.list[int]:
        """Apply a retention policy to the non-quarantined versions; returns the deleted."""
        doomed = policy.to_delete(self.versions())
        self.backend.delete(doomed)
        if doomed:
            log.info("pruned checkpoints %s", doomed)
        return doomed

    def restore(self, version: int, *, now: float | None = None) -> CheckpointInfo:
        """Make ``version`` current by saving it again as a new newest version.

        History is kept: the new version's metadata names ``restored_from``, and a
        coordinator that restarts loads it as the latest. The delta log entries
        newer than ``version`` stop being replayed because replay starts after the
        new, higher version.
        """
        old = self.load(version)
        newest = max((r.version for r in self.backend.records()), default=version)
        stamp = now if now is not None else time.time()
        ckpt = Checkpoint(
            version=newest + 1,
            created_at=stamp,
            params=old.params,
            optimizer=old.optimizer,
            strategy=old.strategy,
            metadata={**old.metadata, "restored_from": version},
            applied_results=old.applied_results,
        )
        return self.save(ckpt, now=now if self.budget is not None else None)
