"""Who is connected: capabilities from hello, resume ids, measured speed.

A client is known by the driver's connection id while connected, and by its
*resume id* across connections: the coordinator hands one out in ``welcome``
and a client that reconnects with it gets its record (rejection count, speed
estimate, cached model version, trust, the leases it holds) back. A resume id is
a bearer capability, so it must not be guessable: with a ``key`` (the server
draws a fresh secret per process) ids are a keyed hash of a counter, so neither
a stranger nor a restart can produce one that was handed out; without one
(the simulator) they come from the job seed, so a seeded run issues the same
ids. The record of a client that
left is kept for resuming until ``forget`` drops it (the core keeps it as long
as the outcomes of its tasks); a resume id forgotten starts a fresh record.

What a flood of short connections may leave behind is bounded by count, not
only by time: a client never given a task has nothing to resume (no lease, no
result, no measured speed), so its record goes when it leaves; and at most
``max_left`` records of clients that left are kept, the one that left first
going first (a resumed record is connected again and leaves that queue), and of
those at most ``max_left_unproven`` whose client never had a result accepted (a
connection that takes a task and vanishes, as a flood of strangers does).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

#: shards remembered per client: what a client keeps decoded (client/shards.py's
#: MAX_HELD_SHARDS); its disk cache may hold more, which the coordinator does not see
HELD_SHARDS = 16


@dataclass(slots=True, kw_only=True)
class ClientRecord:
    client_id: str
    resume_id: str
    name: str
    #: advertised compute rate, FLOP/s (from hello); refined by ``observe_speed``
    flops: float
    connected: bool = True
    joined_at: float = 0.0
    last_seen: float = 0.0
    rejections: int = 0
    accepted: int = 0
    #: tasks it declined, in all and since its last accepted result
    declined: int = 0
    declined_in_row: int = 0
    #: model version the client holds (it has all chunks of it), if any
    version_held: int | None = None
    #: model version of the last task sent to it (a client keeps one model)
    version_sent: int | None = None
    #: exponential moving average of measured FLOP/s
    measured_flops: float | None = None
    #: replication (coordinator/core/replication.py): valid results in a row, results that
    #: went in unchecked, and caught disagreeing
    trust: int = 0
    unverified: int = 0
    #: disagreements with the coordinator's own run of a task (replication.py), in
    #: all, and its last checked results as bits (1: struck), newest lowest
    strikes: int = 0
    recent_checks: int = 0
    excluded: bool = False
    #: the §12 kernel family its hello named (``hello.kernel``; "": unknown), as of
    #: its last hello: replication pairs twins by it and judges by it
    kernel: str = ""
    #: shards of its latest tasks, newest first (at most HELD_SHARDS): a client
    #: keeps the shards it trained on (client/shards.py), so its next task goes to
    #: one of them when the shard cycle allows (strategies/base.py, ShardCursor)
    shards_held: list[int] = field(default_factory=list)

    def rate(self) -> float:
        return self.measured_flops if self.measured_flops is not None else self.flops

    def hold_shard(self, shard: int) -> None:
        """It was given a task on ``shard``: it holds that shard now."""
        held = self.shards_held
        if shard in held:
            held.remove(shard)
        held.insert(0, shard)
        del held[HELD_SHARDS:]

    def observe_speed(self, flops: float, seconds: float) -> None:
        """Fold one finished task into the speed estimate (EMA, weight 0.3)."""
        if seconds <= 0 or flops <= 0:
            return
        r = flops / seconds
        m = self.measured_flops
        self.measured_flops = r if m is None else 0.7 * m + 0.3 * r


class Registry:
    __slots__ = (
        "_by_conn",
        "_by_resume",
        "_counter",
        "_evicted",
        "_key",
        "_left",
        "_left_unproven",
        "_salt",
        "_seen",
        "max_left",
        "max_left_unproven",
    )

    def __init__(
        self,
        seed: int,
        *,
        max_left: int | None = None,
        max_left_unproven: int | None = None,
        key: bytes | None = None,
    ) -> None:
        for name, cap in (("max_left", max_left), ("max_left_unproven", max_left_unproven)):
            if cap is not None and cap < 0:
                raise ValueError(f"{name}: must be >= 0 or None, got {cap!r}")
        #: records of clients that left kept for resuming, at most (None: no cap)
        self.max_left = max_left
        #: of those, records of clients never credited an accepted result
        self.max_left_unproven = max_left_unproven
        self._by_conn: dict[str, ClientRecord] = {}
        #: connected records, least recently seen first (``touch`` moves to the end)
        self._seen: dict[str, ClientRecord] = {}
        self._by_resume: dict[str, ClientRecord] = {}
        #: resume id -> when its client left, oldest first (resumable, not connected)
        self._left: OrderedDict[str, float] = OrderedDict()
        #: the same for clients with no accepted result (also counted in ``_left``)
        self._left_unproven: OrderedDict[str, float] = OrderedDict()
        #: resume ids forgotten since ``take_forgotten`` last drained them
        self._evicted: list[str] = []
        self._counter = 0
        if key is not None and not 16 <= len(key) <= 64:
            raise ValueError(f"key: 16 to 64 bytes, got {len(key)}")
        self._key = key or b""
        self._salt = b"" if key else f"crowdgrad:{seed}:".encode()

    def _new_resume_id(self) -> str:
        self._counter += 1
        msg = self._salt + str(self._counter).encode()
        return hashlib.blake2b(msg, key=self._key, digest_size=12).hexdigest()

    def join(
        self,
        client_id: str,
        *,
        name: str,
        flops: float,
        resume_id: str | None,
        now: float,
        kernel: str = "",
    ) -> tuple[ClientRecord, bool]:
        """Register a connection; returns ``(record, resumed)``.

        An unknown or still-connected resume id starts a fresh record: two
        connections never share one (the core closes the older connection first
        when a resume should take its session over).
        """
        if client_id in self._by_conn:
            raise ValueError(f"client {client_id!r} is already connected")
        old = self._by_resume.get(resume_id) if resume_id else None
        if old is not None and not old.connected:
            self._left.pop(old.resume_id, None)
            self._left_unproven.pop(old.resume_id, None)
            old.client_id = client_id
            old.connected = True
            old.name = name
            old.flops = flops
            old.kernel = kernel
            old.last_seen = now
            self._by_conn[client_id] = old
            self._seen[client_id] = old
            return old, True
        rec = ClientRecord(
            client_id=client_id,
            resume_id=self._new_resume_id(),
            name=name,
            flops=flops,
            kernel=kernel,
            joined_at=now,
            last_seen=now,
        )
        self._by_conn[client_id] = rec
        self._by_resume[rec.resume_id] = rec
        self._seen[client_id] = rec
        return rec, False

    def touch(self, rec: ClientRecord, now: float) -> None:
        """The client was heard from at ``now`` (never earlier than before)."""
        rec.last_seen = now
        seen = self._seen
        if seen.pop(rec.client_id, None) is not None:
            seen[rec.client_id] = rec

    def least_recently_seen(self) -> Iterator[ClientRecord]:
        """Connected records by ``last_seen``, oldest first, so a heartbeat check
        stops at the first client that is not late (collect, then close: the
        iterator is live)."""
        return iter(self._seen.values())

    def leave(self, client_id: str, now: float) -> ClientRecord | None:
        """The connection is gone; its record stays resumable (see the module
        docstring for which records do, and for how long)."""
        self._seen.pop(client_id, None)
        rec = self._by_conn.pop(client_id, None)
        if rec is None:
            return None
        rec.connected = False
        rec.version_held = None  # its cache is unknown after a reconnect
        if rec.version_sent is None:  # never given a task: nothing to resume
            del self._by_resume[rec.resume_id]
            return rec
        left, unproven = self._left, self._left_unproven
        left[rec.resume_id] = now
        if rec.accepted == 0:
            unproven[rec.resume_id] = now
            if self.max_left_unproven is not None:
                while len(unproven) > self.max_left_unproven:
                    self._drop(unproven.popitem(last=False)[0])
        if self.max_left is not None:
            while len(left) > self.max_left:
                self._drop(next(iter(left)))
        return rec

    def _drop(self, resume_id: str) -> None:
        """Forget a record of a client that left (from both queues)."""
        self._left.pop(resume_id, None)
        self._left_unproven.pop(resume_id, None)
        del self._by_resume[resume_id]
        self._evicted.append(resume_id)

    def take_forgotten(self) -> list[str]:
        """Resume ids of records forgotten since the last call (the core drops the
        tasks held open for them)."""
        out, self._evicted = self._evicted, []
        return out

    def forget(self, before: float) -> int:
        """Drop the records of clients that left before ``before``; returns how many."""
        left, n = self._left, 0
        while left:
            resume_id, at = next(iter(left.items()))
            if at >= before:
                break
            self._drop(resume_id)
            n += 1
        return n

    def lookup(self, resume_id: str) -> ClientRecord | None:
        """The record a resume id names, connected or not (None: unknown or forgotten)."""
        return self._by_resume.get(resume_id)

    def known(self) -> int:
        """Records kept: connected clients and those that may still resume."""
        return len(self._by_resume)

    def get(self, client_id: str) -> ClientRecord | None:
        return self._by_conn.get(client_id)

    def connected(self) -> list[ClientRecord]:
        """Connected clients in join order (dict order), for deterministic dispatch."""
        return list(self._by_conn.values())

    def __len__(self) -> int:
        return len(self._by_conn)
