"""The job's training data: loaded and checked once, cut into content-addressed shards.

A task names its rows by the sha256 of a shard file (protocol/shardfile.py), so a
client needs no dataset of its own and fetches each shard once: over the
websocket as ``data`` frames paced like model chunks (a game client has nothing
else), or by HTTP ``GET /data/{sha256}`` (browsers, with their cache). Shard
bytes are a pure function of the data file, the job's ``data`` section and the
seed, so a restarted coordinator names the same hashes and warm caches stay warm.
The held-out test split never leaves the coordinator.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from coordinator.core import events as ev
from coordinator.core.config import JobConfig
from nn.data import Dataset, load_dataset, shard
from nn.datafile import check_against, load_file
from protocol import messages as m
from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import LinkLimits
from protocol.shardfile import encode_shard, sha256_hex

#: Bytes of a ``data`` frame besides its payload, rounded up (type, a 64-digit
#: hash, offset, size and the bin header come to about 110).
DATA_ENVELOPE = 160


def load_job_data(job: JobConfig) -> Dataset:
    """The job's dataset, held to its model; raises ValueError naming the fault."""
    d = job.data
    if d.path is not None:
        ds = load_file(d.path, label=d.label, seed=d.seed)
    else:
        ds = load_dataset(str(d.dataset), seed=d.seed)
    check_against(ds, job.spec, source=f"data {d.source!r}")
    return ds


@dataclass(frozen=True, slots=True)
class ShardBlob:
    """Shard ``index`` of the training split as its file bytes and their hash."""

    index: int
    sha256: str
    blob: bytes
    rows: int


class DataCatalog:
    """Shards by index and by hash, and their ``data`` frames per frame size."""

    def __init__(self, dataset: Dataset, parts: list[np.ndarray]) -> None:
        classes = dataset.num_classes or 0
        #: each shard's rows of the training split (int32, sorted)
        self.indices = [np.asarray(idx).astype(np.int32) for idx in parts]
        self.shards: list[ShardBlob] = []
        for i, idx in enumerate(parts):
            blob = encode_shard(dataset.X_train[idx], dataset.y_train[idx], classes=classes)
            self.shards.append(ShardBlob(i, sha256_hex(blob), blob, len(idx)))
        self.by_hash = {s.sha256: s for s in self.shards}
        #: the job's shards' mean size: what a client's fetch of one costs its link
        self.mean_bytes = self.total_bytes / max(1, len(self.shards))
        #: and its mean rows: what sizes a client's task before its shard is chosen
        self.mean_rows = round(sum(s.rows for s in self.shards) / max(1, len(self.shards)))
        #: shards added while the job runs, by index (``add``)
        self.extra: dict[int, ShardBlob] = {}
        # (hash, frame bytes) -> the whole shard's frames from offset 0
        self._frames: dict[tuple[str, int], list[tuple[m.Data, bytes]]] = {}

    def shard(self, index: int) -> ShardBlob:
        """A shard of the job's data, or one added since (a boundary shard)."""
        if index < len(self.shards):
            return self.shards[index]
        return self.extra[index]

    def add(self, blob: ShardBlob) -> None:
        """Serve a shard made while the job runs (a layer-split job's boundary
        activations, coordinator/core/layersplit.py) under its index and hash."""
        if blob.index < len(self.shards) or blob.index in self.extra:
            raise ValueError(f"shard {blob.index}: that index is taken")
        self.extra[blob.index] = blob
        self.by_hash.setdefault(blob.sha256, blob)

    def discard(self, index: int) -> None:
        """Stop serving an added shard (no-op for one gone already)."""
        blob = self.extra.pop(index, None)
        if blob is None or self.by_hash.get(blob.sha256) is not blob:
            return
        del self.by_hash[blob.sha256]
        for key in [k for k in self._frames if k[0] == blob.sha256]:
            del self._frames[key]

    def slow_to_fetch(self, limits: LinkLimits, compute_s: float) -> bool:
        """Whether fetching a shard over ``limits`` takes at least as long as the
        client's task computes (``compute_s``): then shard affinity
        (strategies/base.py, ShardCursor.next) pays. Otherwise the cycle's own
        order is kept, where affinity was measured no better and sometimes worse
        (docs/performance.md, sessions 9 and 14)."""
        return self.mean_bytes / limits.bytes_per_s >= compute_s

    @classmethod
    def for_job(cls, job: JobConfig, dataset: Dataset) -> DataCatalog:
        parts = shard(dataset.y_train, job.data.shards, kind=job.data.sharding, seed=job.data.seed)
        return cls(dataset, parts)

    @property
    def total_bytes(self) -> int:
        return sum(len(s.blob) for s in self.shards)

    def answer(
        self, client_id: str, msg: m.Fetch, limits: LinkLimits, now: float
    ) -> tuple[list[tuple[m.Data, bytes]], ev.DataServed]:
        """The ``data`` frames that answer a fetch, and the event that says so."""
        frames, nbytes = self.serve(msg, limits.frame_bytes)
        served = ev.DataServed(
            client_id=client_id,
            sha256=msg.data,
            nbytes=nbytes,
            frame_bytes=sum(len(f) for _, f in frames),
            now=now,
        )
        return frames, served

    def serve(self, msg: m.Fetch, frame_bytes: int) -> tuple[list[tuple[m.Data, bytes]], int]:
        """A client's ``fetch`` (docs/protocol.md §13.1): the frames that answer it
        and the shard bytes they carry; a shard it cannot name or an offset past
        its end is the peer's fault (``ProtocolError``)."""
        blob = self.by_hash.get(msg.data)
        if blob is None:
            raise ProtocolError(ErrorCode.UNKNOWN_TASK, f"fetch.data {msg.data}: no such shard")
        if msg.offset >= len(blob.blob):
            raise ProtocolError(
                ErrorCode.BAD_FIELD,
                f"fetch.offset: expected < {len(blob.blob)} (the shard's size), got {msg.offset}",
            )
        return self.frames(msg.data, msg.offset, frame_bytes), len(blob.blob) - msg.offset

    def frames(self, sha256: str, offset: int, frame_bytes: int) -> list[tuple[m.Data, bytes]]:
        """The ``data`` frames carrying the shard from ``offset`` on, each at most
        ``frame_bytes`` (the link's burst, as model chunks are sized). The whole
        shard's frames are built once per frame size and shared by every client."""
        s = self.by_hash[sha256]
        step = max(1024, frame_bytes - DATA_ENVELOPE)
        if offset == 0:
            key = (sha256, step)
            cached = self._frames.get(key)
            if cached is None:
                cached = self._frames[key] = list(self._build(s, 0, step))
            return cached
        return list(self._build(s, offset, step))

    @staticmethod
    def _build(s: ShardBlob, offset: int, step: int) -> Iterator[tuple[m.Data, bytes]]:
        size = len(s.blob)
        view = memoryview(s.blob)
        for start in range(offset, size, step):
            msg = m.Data.trusted(
                data=s.sha256, offset=start, size=size, payload=view[start : start + step]
            )
            yield msg, m.encode(msg)
