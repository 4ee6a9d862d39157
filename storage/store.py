"""CheckpointStore: versioned, checksummed, atomically visible checkpoints.

Call-order contract for a coordinator: ``open`` → ``load_latest`` (restore) →
``save`` every N versions and on shutdown → ``prune`` after a save → ``close``.
Loading verifies every chunk; a corrupt newest checkpoint is logged, quarantined
(kept for inspection, never loaded again) and the previous valid one is used.

Incremental saves (a ``ParamsPatch`` as the params) write only the neuron groups
that changed since their base and refer to the stored chunks for the rest, so a
model trained by sub-model tasks costs per checkpoint what its merges touched.
One stored chunk then backs several versions: damage to it fails each of them.
"""

from __future__ import annotations

import builtins
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from nn.params import NeuronGroup, Params, plan_groups
from nn.spec import ModelSpec
from storage.chunkstore import ChunkStore, Deferred, Inherited, ManifestRecord
from storage.errors import CheckpointExists, CorruptCheckpoint, NoCheckpoint
from storage.layout import (
    Checkpoint,
    Chunk,
    LiveChunk,
    LiveParams,
    ParamsPatch,
    decode,
    encode,
    parse_manifest,
    seal,
    sha256_hex,
)
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
    #: the checkpoint an incremental one was written on (None: a full one)
    base: int | None = None


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

    # -- task ids -----------------------------------------------------------------

    def task_ids_reserved(self) -> int:
        """Every task id a coordinator on this store issued is below this (0: none
        recorded). A run that follows starts above it: a result a client kept for a
        task of an earlier run then never matches a new task, even when that run
        left no checkpoint and no journal entry behind."""
        value = self.backend.get_meta("task_ids_reserved")
        return 0 if value is None else int(value)

    def reserve_task_ids(self, below: int) -> None:
        """Record, durably, that ids up to ``below`` may be issued (it only grows)."""
        if below > self.task_ids_reserved():
            self.backend.set_meta("task_ids_reserved", str(int(below)))

    # -- writing ------------------------------------------------------------------

    def param_groups(self, spec: ModelSpec) -> builtins.list[NeuronGroup]:
        """The neuron groups a checkpoint of ``spec`` stores one chunk each, in chunk
        order: the indices a ``ParamsPatch`` uses."""
        return plan_groups(spec, self.limits.max_chunk_bytes // 4)

    def _encode(
        self, ckpt: Checkpoint
    ) -> tuple[dict, builtins.list[Chunk | Inherited | LiveChunk]]:
        base = None
        based = isinstance(ckpt.params, ParamsPatch | LiveParams)
        if based and ckpt.params.base is not None:  # type: ignore[union-attr]
            if ckpt.params.base >= ckpt.version:  # the base is stored: so is a newer one
                raise CheckpointExists(
                    f"version {ckpt.version} is not above its base v{ckpt.params.base}"
                )
            record = self.backend.record(ckpt.params.base)
            if record is None or record.quarantined:
                raise NoCheckpoint(
                    f"checkpoint v{ckpt.version}: its base v{ckpt.params.base} is not stored"
                )
            base = parse_manifest(record.version, record.manifest, record.manifest_sha256)
        return encode(ckpt, self.limits.max_chunk_bytes, base)

    def write_cost(self, ckpt: Checkpoint) -> int:
        """Writes a save costs against the budget: one per chunk written (inherited
        ones are free) plus the manifest."""
        _, chunks = self._encode(ckpt)
        return sum(not isinstance(c, Inherited) for c in chunks) + 1

    @staticmethod
    def _deferred(
        chunks: builtins.list[Chunk | Inherited | LiveChunk], manifest: dict, hashes: list
    ) -> builtins.list[Chunk | Inherited | Deferred]:
        """Live chunks as the backend reads them: each copy hashed, and its
        ``as_of`` put in the manifest, when the backend writes it."""
        out: builtins.list[Chunk | Inherited | Deferred] = []
        for i, c in enumerate(chunks):
            if not isinstance(c, LiveChunk):
                out.append(c)
                continue

            def read(c: LiveChunk = c, i: int = i) -> tuple[np.ndarray, ...]:
                parts, as_of = c.read()
                hashes[i] = sha256_hex(*parts)
                manifest["chunks"][i]["as_of"] = as_of
                return parts

            out.append(Deferred(read))
        return out

    def save(self, ckpt: Checkpoint, *, now: float | None = None) -> CheckpointInfo:
        """Store ``ckpt`` atomically; when this returns it is durable and visible.

        ``now`` feeds the write budget (required when ``writes_per_minute`` is
        set; raises ``WriteBudgetExceeded`` with nothing written when spent). A
        ``ParamsPatch`` whose base is not stored raises ``NoCheckpoint``.
        """
        manifest, chunks = self._encode(ckpt)
        own = [c for c in chunks if not isinstance(c, Inherited)]
        if self.budget is not None:
            if now is None:
                raise ValueError("save: a writes_per_minute budget needs the caller's `now`")
            self.budget.require(len(own) + 1, now)
        nbytes = sum(
            e["nbytes"]
            for e, c in zip(manifest["chunks"], chunks, strict=True)
            if not isinstance(c, Inherited)
        )

        def finish(hashes: list) -> ManifestRecord:
            blob, digest = seal(
                manifest, (h if h is None or isinstance(h, str) else h.result() for h in hashes)
            )
            return ManifestRecord(
                version=ckpt.version,
                created_at=float(ckpt.created_at),
                nbytes=nbytes,
                n_chunks=len(chunks),
                quarantined=False,
                manifest=blob,
                manifest_sha256=digest,
            )

        if any(isinstance(c, LiveChunk) for c in chunks):
            # Read, hashed and written one at a time: the model keeps training.
            hashes: list = [None] * len(chunks)
            for i, c in enumerate(chunks):
                if not isinstance(c, Inherited | LiveChunk):
                    hashes[i] = sha256_hex(*c)
            record = self.backend.commit(
                ckpt.version, self._deferred(chunks, manifest, hashes), lambda: finish(hashes)
            )
            log.info("checkpoint v%d saved while training: %d bytes", ckpt.version, nbytes)
            return self._info(record, manifest)
        if nbytes >= _POOL_MIN_BYTES and len(own) > 1:
            # Hash on worker threads while the backend writes the same chunks.
            with ThreadPoolExecutor(_workers()) as pool:
                futures = [
                    None if isinstance(c, Inherited) else pool.submit(sha256_hex, *c)
                    for c in chunks
                ]
                record = self.backend.commit(ckpt.version, chunks, lambda: finish(futures))
        else:
            hashes = [None if isinstance(c, Inherited) else sha256_hex(*c) for c in chunks]
            record = self.backend.commit(ckpt.version, chunks, lambda: finish(hashes))
        log.info(
            "checkpoint v%d saved: %d of %d chunks written, %d bytes",
            ckpt.version, len(own), len(chunks), nbytes,
        )  # fmt: skip
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
            base=m.get("base"),
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

    def load(self, version: int, *, into: Params | None = None) -> Checkpoint:
        """One version, every checksum verified; ``CorruptCheckpoint`` if any fails.
        ``into``: fill these params (a mapped model) instead of allocating; on
        failure they hold a partial mix and must not be used."""
        with self.backend.snapshot():
            record = self.backend.record(version)
            if record is None:
                raise NoCheckpoint(f"no checkpoint v{version} in the store")
            manifest = parse_manifest(version, record.manifest, record.manifest_sha256)
            chunks = self.backend.iter_chunks(version)
            if record.nbytes >= _POOL_MIN_BYTES and record.n_chunks > 1:
                with ThreadPoolExecutor(_workers()) as pool:
                    return decode(version, manifest, chunks, pool, into=into)
            return decode(version, manifest, chunks, into=into)

    def load_latest(self, *, quarantine: bool = True, into: Params | None = None) -> Checkpoint:
        """The newest checkpoint that verifies, falling back past corrupt ones.

        Each corrupt one is logged as a warning and, with ``quarantine``, marked so
        it is skipped from then on and a new save may reuse its version number.
        """
        for v in reversed(self.versions()):
            try:
                return self.load(v, into=into)
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
