"""Where a client keeps the shards it fetched: one file per sha256, checked on read.

A shard is named by the hash of its bytes (docs/protocol.md §13), so a cached
copy never goes stale: the same hash is the same rows in any job on any
coordinator. The desktop client keeps them on disk (``DiskCache``) so that a
second run, or a second job on the same data, transfers no shard bytes; the
simulator gives each player a ``MemoryCache``. Both are bounded in bytes, least
recently used going first: a layer-split job hands out a new shard of boundary
activations with every upper task (docs/protocol.md §3.3.2), and a volunteer's
disk is not the job's to fill.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections import OrderedDict
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


#: bytes a ``MemoryCache`` and a ``DiskCache`` keep at most, by default
MEMORY_CACHE_BYTES = 64 << 20
DISK_CACHE_BYTES = 1 << 30


class MemoryCache:
    """Shards in a dict (the simulator's players; tests), at most ``max_bytes``."""

    def __init__(self, max_bytes: int = MEMORY_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.blobs: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0

    def get(self, sha256: str) -> bytes | None:
        blob = self.blobs.get(sha256)
        if blob is not None:
            self.blobs.move_to_end(sha256)
        return blob

    def put(self, sha256: str, blob: bytes) -> None:
        old = self.blobs.pop(sha256, None)
        self._bytes += len(blob) - (0 if old is None else len(old))
        self.blobs[sha256] = blob
        while self._bytes > self.max_bytes and len(self.blobs) > 1:
            _, gone = self.blobs.popitem(last=False)
            self._bytes -= len(gone)


class DiskCache:
    """Shards as ``<dir>/<sha256>.shard`` files, written atomically (temp + rename).

    A file whose bytes no longer match its name (a torn disk, an edit) is removed
    and reported missing, so the client fetches it again.
    """

    def __init__(self, directory: str | Path, max_bytes: int = DISK_CACHE_BYTES) -> None:
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        #: the folder's shards by last use, and their bytes (read at the first put),
        #: and those bytes' sum
        self._index: OrderedDict[str, int] | None = None
        self._bytes = 0

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
        if self._index is not None and sha256 in self._index:
            self._index.move_to_end(sha256)
        return blob

    def put(self, sha256: str, blob: bytes) -> None:
        path = self._path(sha256)
        try:
            write_atomic(path, blob)
        except OSError as exc:  # a full or read-only disk costs a refetch, nothing more
            log.warning("shard cache: cannot write %s: %s", path, exc)
            return
        index = self._files()
        self._bytes += len(blob) - index.pop(sha256, 0)
        index[sha256] = len(blob)
        while self._bytes > self.max_bytes and len(index) > 1:
            gone, size = index.popitem(last=False)
            (self.dir / f"{gone}.shard").unlink(missing_ok=True)
            self._bytes -= size

    def _files(self) -> OrderedDict[str, int]:
        """The shards in the folder, least recently written first (mtime) when
        first asked; then kept up to date by ``get`` and ``put``."""
        if self._index is None:
            found = []
            for p in self.dir.glob("*.shard"):
                try:
                    st = p.stat()
                except OSError:
                    continue
                if is_sha256_hex(p.stem):
                    found.append((st.st_mtime, p.stem, st.st_size))
            self._index = OrderedDict((sha, size) for _, sha, size in sorted(found))
            self._bytes = sum(self._index.values())
        return self._index
