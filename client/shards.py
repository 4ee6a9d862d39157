"""The shards a client session holds and fetches (docs/protocol.md §13).

A task that names its rows by hash computes once that shard is here: decoded
from the injected cache, or fetched with ``fetch`` and answered by ``data``
frames. A fetch cut by a reconnect goes on from the bytes already received; a
shard is checked against its hash before it is cached or used. At most
``MAX_HELD_SHARDS`` stay decoded; the cache keeps the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass

from client.datacache import ShardCache
from protocol import messages as m
from protocol.shardfile import ShardData, ShardError, decode_shard, sha256_hex

log = logging.getLogger(__name__)

#: decoded shards a session keeps (a layer-split job sends a new one per upper task)
MAX_HELD_SHARDS = 16


@dataclass(slots=True)
class _Fetching:
    """A shard on its way: the bytes so far, and whether a ``fetch`` is out for it."""

    buf: bytearray
    received: int = 0
    requested: bool = False
    size: int | None = None


class Shards:
    """Decoded shards by hash (``held``), those on their way, and the cache."""

    def __init__(self, cache: ShardCache) -> None:
        self.cache = cache
        self.held: dict[str, ShardData] = {}
        self._fetching: dict[str, _Fetching] = {}
        #: shard bytes received in ``data`` frames
        self.data_bytes = 0

    def need(
        self, task: m.Task, keep: Collection[str | None], *, served: bool
    ) -> tuple[bool, m.Fetch | None]:
        """``(the task's shard is here, a fetch to send)``: held, or taken from the
        cache, or asked of a server that ``served`` shards (once a connection;
        after a reconnect from the bytes already in)."""
        sha = task.data
        if sha is None or sha in self.held:
            return True, None
        blob = self.cache.get(sha)
        if blob is not None:
            try:
                self.hold(sha, decode_shard(blob), keep)
                return True, None
            except ShardError as exc:
                log.warning("cached shard %s unusable (%s): fetching it again", sha[:12], exc)
        if not served:
            log.warning("task %s names shard %s, the server serves none", task.task_id, sha[:12])
            return False, None
        f = self._fetching.setdefault(sha, _Fetching(bytearray()))
        if f.requested:
            return False, None
        f.requested = True
        return False, m.Fetch(data=sha, offset=f.received)

    def receive(self, msg: m.Data, keep: Collection[str | None]) -> tuple[m.Fetch | None, bool]:
        """A ``data`` frame: ``(a fetch to send, the shard is now held)``. The
        fetch asks again from the start when the bytes did not follow on."""
        f = self._fetching.get(msg.data)
        if f is None or not f.requested:
            return None, False  # no task waits for it any more, or an old connection's
        if msg.offset != f.received or (f.size is not None and msg.size != f.size):
            log.warning("shard %s: data at %d, expected %d: asking again", msg.data[:12],
                        msg.offset, f.received)  # fmt: skip
            del self._fetching[msg.data]
            self._fetching[msg.data] = _Fetching(bytearray(), requested=True)
            return m.Fetch(data=msg.data), False
        if f.size is None:
            f.size = msg.size
        f.buf += msg.payload
        f.received += len(msg.payload)
        self.data_bytes += len(msg.payload)
        if f.received < msg.size:
            return None, False
        del self._fetching[msg.data]
        blob = bytes(f.buf)
        try:
            if sha256_hex(blob) != msg.data:
                raise ShardError("its bytes do not match its hash")
            shard = decode_shard(blob)
        except ShardError as exc:
            log.warning("shard %s refused: %s", msg.data[:12], exc)
            return None, False  # the waiting task's lease runs out; nothing wrong is computed
        self.cache.put(msg.data, blob)
        self.hold(msg.data, shard, keep)
        return None, True

    def hold(self, sha: str, shard: ShardData, keep: Collection[str | None]) -> None:
        """Keep a decoded shard, and at most ``MAX_HELD_SHARDS``: the oldest go,
        except those in ``keep`` (the shards of the current and the queued task)."""
        self.held.pop(sha, None)
        self.held[sha] = shard
        for old in list(self.held):
            if len(self.held) <= MAX_HELD_SHARDS:
                break
            if old not in keep:
                del self.held[old]

    def connection_lost(self) -> None:
        """Every fetch is asked again on the next connection, from where it stopped."""
        for f in self._fetching.values():
            f.requested = False
