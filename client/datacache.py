"""Where a client keeps the shards it fetched: one file per sha256, checked on read.

A shard is named by the hash of its bytes (docs/protocol.md §13), so a cached
copy never goes stale: the same hash is the same rows in any job on any
coordinator. The desktop client keeps them on disk (``DiskCache``) so that a
second run, or a second job on the same data, transfers no shard bytes; the
simulator gives each player a ``MemoryCache``.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Protocol

from protocol.shardfile import is_sha256_hex, sha256_hex

log = logging.getLogger(__name__)


class ShardCache(Protocol):
    """What the client session needs of a cache (``get`` verifies, ``put`` trusts)."""

    def get(self, sha256: str) -> bytes | None: ...

    def put(self, sha256: str, blob: bytes) -> None: ...


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file and a rename (creating the
    folder): a reader sees the old file or the whole new one, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def default_cache_dir() -> Path:
    """``$CROWDGRAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/crowdgrad/data``, else
    ``~/.cache/crowdgrad/data``."""
    env = os.environ.get("CROWDGRAD_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "crowdgrad" / "data"


class MemoryCache:
    """A dict of shards (the simulator's players; tests)."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    def get(self, sha256: str) -> bytes | None:
        return self.blobs.get(sha256)

    def put(self, sha256: str, blob: bytes) -> None:
        self.blobs[sha256] = blob


class DiskCache:
    """Shards as ``<dir>/<sha256>.shard`` files, written atomically (temp + rename).

    A file whose bytes no longer match its name (a torn disk, an edit) is removed
    and reported missing, so the client fetches it again.
    """

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)

    def _path(self, sha256: str) -> Path:
        if not is_sha256_hex(sha256):
            raise ValueError(f"shard cache: {sha256!r} is not a sha256")
        return self.dir / f"{sha256}.shard"

    def get(self, sha256: str) -> bytes | None:
        path = self._path(sha256)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("shard cache: cannot read %s: %s", path, exc)
            return None
        if sha256_hex(blob) != sha256:
            log.warning("shard cache: %s does not match its hash; removed", path)
            path.unlink(missing_ok=True)
            return None
        return blob

    def put(self, sha256: str, blob: bytes) -> None:
        path = self._path(sha256)
        try:
            write_atomic(path, blob)
        except OSError as exc:  # a full or read-only disk costs a refetch, nothing more
            log.warning("shard cache: cannot write %s: %s", path, exc)
