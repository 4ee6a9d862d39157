"""The shard file: one client's rows of a dataset as one content-addressed blob.

A coordinator cuts its training split into shards and names each by the sha256
of its bytes (docs/protocol.md §13). The same bytes travel over the websocket
(``data`` frames), over HTTP (``GET /data/{sha256}``) and sit in a client's cache,
so a hash proves the client computes on exactly the rows the server meant.

Layout (little-endian, every field 4-byte aligned so that a browser can view the
arrays in place when the blob starts at an aligned offset)::

    offset  format        field
    0       8s            magic  b"CGSHARD1"
    8       <I            rows n (>= 1)
    12      <I            features f (>= 1)
    16      <I            targets t: 0 = integer class labels, t >= 1 = float targets [n, t]
    20      <I            classes c: labels lie in [0, c) (0 when t >= 1)
    24      <{n*f}f       X, float32, row-major
    ...     <{n}i         y when t = 0: int32 labels
            <{n*t}f       y when t >= 1: float32 targets, row-major

Nothing follows y; a blob of any other length is invalid.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np

MAGIC = b"CGSHARD1"
HEADER = struct.Struct("<8sIIII")
#: A shard larger than this is refused before it is allocated (4 GiB - 1: sizes are u32).
MAX_SHARD_BYTES = (1 << 32) - 1


class ShardError(ValueError):
    """A blob that is not a valid shard file (the message says which field)."""


@dataclass(frozen=True, slots=True)
class ShardData:
    """Decoded rows: ``X`` float32 [n, f]; ``y`` int32 [n] labels or float32 [n, t]."""

    X: np.ndarray
    y: np.ndarray
    classes: int

    @property
    def rows(self) -> int:
        return int(self.X.shape[0])


def sha256_hex(blob: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(blob).hexdigest()


def is_sha256_hex(text: str) -> bool:
    """64 lowercase hex digits: the only form a shard name takes on the wire."""
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def encode_shard(X: np.ndarray, y: np.ndarray, *, classes: int = 0) -> bytes:
    """The blob for rows ``X`` and labels/targets ``y`` (see the module docstring)."""
    X = np.ascontiguousarray(X, dtype="<f4")
    if X.ndim != 2 or X.shape[0] < 1 or X.shape[1] < 1:
        raise ShardError(f"shard: X must be a non-empty 2-D array, got shape {X.shape}")
    n, f = X.shape
    y = np.asarray(y)
    if np.issubdtype(y.dtype, np.integer):
        if y.shape != (n,):
            raise ShardError(f"shard: labels must have shape ({n},), got {y.shape}")
        if classes < 1 or (y.size and (int(y.min()) < 0 or int(y.max()) >= classes)):
            raise ShardError(f"shard: labels must lie in [0, {classes})")
        t, ybytes = 0, np.ascontiguousarray(y, dtype="<i4").tobytes()
    else:
        y2 = y.reshape(n, -1) if y.ndim == 1 else y
        if y2.ndim != 2 or y2.shape[0] != n or y2.shape[1] < 1:
            raise ShardError(f"shard: float targets must have shape ({n}, t), got {y.shape}")
        t, classes = int(y2.shape[1]), 0
        ybytes = np.ascontiguousarray(y2, dtype="<f4").tobytes()
    blob = HEADER.pack(MAGIC, n, f, t, classes) + X.tobytes() + ybytes
    if len(blob) > MAX_SHARD_BYTES:
        raise ShardError(f"shard: {len(blob)} bytes, more than a shard may hold")
    return blob


def shard_size(rows: int, features: int, targets: int) -> int:
    """Bytes of a shard with this shape (what a header promises)."""
    return HEADER.size + 4 * rows * features + 4 * rows * max(1, targets)


def decode_shard(blob: bytes | bytearray | memoryview) -> ShardData:
    """Parse and check a blob; the arrays are copies (aligned, writable)."""
    mv = memoryview(blob).cast("B")
    if len(mv) < HEADER.size:
        raise ShardError(f"shard: {len(mv)} bytes, shorter than its {HEADER.size}-byte header")
    magic, n, f, t, c = HEADER.unpack_from(mv, 0)
    if magic != MAGIC:
        raise ShardError(f"shard: magic {bytes(magic)!r}, expected {MAGIC!r}")
    if n < 1 or f < 1:
        raise ShardError(f"shard: rows {n} and features {f} must be >= 1")
    if t == 0 and c < 1:
        raise ShardError("shard: labelled shard (targets 0) with classes 0")
    want = shard_size(n, f, t)
    if len(mv) != want:
        raise ShardError(f"shard: {len(mv)} bytes, the header promises {want}")
    off = HEADER.size
    X = np.frombuffer(mv, dtype="<f4", count=n * f, offset=off).reshape(n, f).astype(np.float32)
    off += 4 * n * f
    if t == 0:
        y = np.frombuffer(mv, dtype="<i4", count=n, offset=off).astype(np.int32)
        if int(y.min()) < 0 or int(y.max()) >= c:
            raise ShardError(f"shard: a label lies outside [0, {c})")
    else:
        y = np.frombuffer(mv, dtype="<f4", count=n * t, offset=off).reshape(n, t).astype(np.float32)
        if not np.isfinite(y).all():
            raise ShardError("shard: targets contain NaN or inf")
    if not np.isfinite(X).all():
        raise ShardError("shard: X contains NaN or inf")
    return ShardData(X=X, y=y, classes=int(c))
