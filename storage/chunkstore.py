"""ChunkStore: where checkpoint chunks and manifests live, behind a small interface.

The interface is deliberately byte-level: layout, checksums, versions policy and
retention live in ``storage.store.CheckpointStore``, so a backend only has to
give two guarantees:

1. ``commit`` makes all chunks and the manifest of one version visible together
   or not at all (the manifest row is what a reader looks for, and it is written
   in the same transaction as the chunks).
2. Reads made inside one ``snapshot()`` see one committed state, whatever a
   concurrent writer commits or deletes meanwhile.

Incremental checkpoints: a chunk of a new version may be ``Inherited`` from an
earlier one (a neuron group that did not change). The backend stores a reference,
not the bytes, reads it back as that version's chunk, and keeps the referenced
bytes for as long as any stored version refers to them, whatever is deleted.

SQLite (``storage.sqlite.SqliteChunkStore``) is the embedded default.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Inherited:
    """In ``commit``'s chunks: this index's bytes are the same index of checkpoint
    ``version`` (the one that wrote them; never itself a reference)."""

    version: int


@dataclass(frozen=True, slots=True)
class Deferred:
    """In ``commit``'s chunks: bytes read only when the backend writes this chunk
    (``read()`` gives its buffers), so a chunk of a model that keeps changing is
    copied one at a time, never all at once."""

    read: Callable[[], Sequence[Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class ManifestRecord:
    """One stored checkpoint as the backend sees it: a manifest blob and its hash.
    ``nbytes`` counts the bytes this version wrote (its inherited chunks are not
    counted again); ``n_chunks`` counts every chunk it reads back."""

    version: int
    created_at: float
    nbytes: int
    n_chunks: int
    quarantined: bool
    manifest: bytes
    manifest_sha256: str


class ChunkStore(ABC):
    """Byte-level storage of versioned chunk sets; see the module docstring."""

    @abstractmethod
    def commit(
        self,
        version: int,
        chunks: Sequence[Sequence[Any] | Inherited | Deferred],
        finish: Callable[[], ManifestRecord],
    ) -> ManifestRecord:
        """Store ``chunks`` and the record ``finish()`` returns, atomically.

        A chunk is a sequence of buffers whose concatenation is its bytes, a
        ``Deferred`` one (read when written, in index order), or an ``Inherited``
        reference (``StorageError`` when the version it names holds no such
        chunk); its index is its position. ``finish`` is called after the
        chunks are written, inside the transaction, so checksums can be computed
        while the chunks are written.
        Raises ``CheckpointExists`` when ``version`` is not above every stored,
        non-quarantined version; quarantined versions at or above it are replaced.
        """

    @abstractmethod
    def records(self) -> list[ManifestRecord]:
        """Every stored checkpoint, ascending by version (quarantined ones included)."""

    @abstractmethod
    def record(self, version: int) -> ManifestRecord | None: ...

    @abstractmethod
    def iter_chunks(self, version: int) -> Iterator[tuple[int, bytes]]:
        """``(index, data)`` of one version, ascending by index."""

    @abstractmethod
    def snapshot(self) -> AbstractContextManager[None]:
        """Reads inside the block see one committed state."""

    @abstractmethod
    def delete(self, versions: Sequence[int]) -> None:
        """Remove versions (manifest and chunks) in one transaction."""

    @abstractmethod
    def quarantine(self, version: int) -> None:
        """Mark a version as failed verification: kept for inspection, never loaded."""

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def put_blob(self, sha256: str, data: bytes) -> bool:
        """Keep ``data`` under its content hash (checked by the caller); True if new."""

    @abstractmethod
    def get_blob(self, sha256: str) -> bytes | None:
        """The bytes kept under ``sha256``, or None."""

    @abstractmethod
    def get_meta(self, key: str) -> str | None:
        """A small value kept beside the checkpoints, or None."""

    @abstractmethod
    def set_meta(self, key: str, value: str) -> None:
        """Keep ``value`` under ``key``, durably, replacing what was there."""
