"""Per-connection state: what each connected client is doing, and its outbox.

The core (coordinator/core/machine.py) keeps one :class:`Conn` per open connection in a
:class:`Connections` table. A connection's phase says whether the next dispatch owes it a task:
READY holds no lease (a task at the next dispatch), WORKING a live lease (and maybe a queued
one behind it), PREFETCH a live lease and it asked for its next task (``prefetch``,
docs/protocol.md §3.12), CLOSED is gone. Transitions (a missing entry is a programming error,
raised as ``ConnError``)::

    READY    -> WORKING              leased a task
    WORKING  -> PREFETCH             asked for its next task
             -> READY                its last lease resolved (LeaseBook.on_release)
    PREFETCH -> PREFETCH             asked again (the two sides race)
             -> WORKING              leased a task queued behind its current one
             -> READY                its lease resolved before the next was leased
    any      -> CLOSED

A client that declined a task lately is *cooling* (``declined``): whatever its phase, it gets
no task before its back-off runs out. Each event costs O(what changed), not O(clients), and
dispatch and flush visit connections in join order (docs/coordinator.md, "Connections").
"""

from __future__ import annotations

import enum
import heapq
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from coordinator.core import events as ev
from coordinator.core.leases import LeaseBook
from coordinator.core.linkcodecs import LinkCodecs
from coordinator.core.uploads import Uploads
from protocol import messages as m
from protocol.errors import CLOSE_NORMAL, ErrorCode, ProtocolError
from protocol.limits import LinkLimits, Pacer, RateMeter
from protocol.outbox import PacedOutbox
from protocol.states import checked_move

log = logging.getLogger(__name__)

#: After a ``decline`` the client gets no task for this long, doubled with every
#: decline in a row up to the cap (an accepted result resets it): a client that
#: can do nothing costs a task a minute, not a spin (docs/protocol.md §3.13).
DECLINE_BACKOFF_S = 1.0
DECLINE_BACKOFF_MAX_S = 60.0


class ConnState(enum.Enum):
    READY = "ready"
    WORKING = "working"
    PREFETCH = "prefetch"
    CLOSED = "closed"


CONN_TRANSITIONS: dict[ConnState, frozenset[ConnState]] = {
    ConnState.READY: frozenset({ConnState.WORKING, ConnState.CLOSED}),
    ConnState.WORKING: frozenset({ConnState.PREFETCH, ConnState.READY, ConnState.CLOSED}),
    ConnState.PREFETCH: frozenset(
        {ConnState.PREFETCH, ConnState.WORKING, ConnState.READY, ConnState.CLOSED}
    ),
    ConnState.CLOSED: frozenset(),
}


class ConnError(RuntimeError):
    """An illegal connection transition: a bug in the core, never a client's fault."""


@dataclass(slots=True)
class Conn:
    """One connection: its phase, granted limits, outbound queue, uploads in flight,
    and what its hello said it can do."""

    client_id: str
    limits: LinkLimits
    uploads: Uploads
    #: the codecs of this link's transfers (linkcodecs.choose)
    codecs: LinkCodecs
    #: frames waiting for the link, released by the granted limits' pacer
    outbox: PacedOutbox[ev.Send] = field(init=False)
    meter: RateMeter = field(init=False)
    state: ConnState = ConnState.READY
    #: the client applies model deltas in ``codecs.delta`` (from hello)
    deltas: bool = False
    #: deltas sent in a row since the last full model (drift bound)
    delta_chain: int = 0
    #: the client builds version 0 from the job's init seed: its hello lists the
    #: portable init scheme (docs/protocol.md §12.3; hello.seeded_init alone means
    #: NumPy's PCG64, which this coordinator's version 0 is not)
    seeded_init: bool = False
    #: the client takes chunks spanning several blocks (from hello)
    spans: bool = False
    #: the client takes its rows as shards named by hash (hello.data, §13)
    data: bool = False
    #: the client returns a layer-split task's boundary (hello.boundary, §3.3.2)
    boundary: bool = False
    #: shards named in a task to this connection so far (the first pays its transfer)
    shards_named: set[str] = field(default_factory=set)
    #: offered prefetch (welcome.prefetch): its tasks are sized to hide their
    #: transfers behind their compute (handshake.offers_prefetch)
    prefetch: bool = False
    #: the peer's address as the driver saw it (None: not given), for RefusalMarks
    address: str | None = None

    def __post_init__(self) -> None:
        self.outbox = PacedOutbox(Pacer(self.limits))
        self.meter = RateMeter(self.limits)

    def move(self, to: ConnState) -> None:
        self.state = checked_move(
            f"connection {self.client_id!r}", CONN_TRANSITIONS, self.state, to, ConnError
        )


class Connections:
    """The open connections by client id (``by_id``, in join order), and the
    indexes dispatch, pacing and the decline back-off need (module docstring)."""

    __slots__ = (
        "_dirty",
        "_joined",
        "_order",
        "_ready",
        "_ready_heap",
        "_waiting",
        "by_id",
        "cooling",
    )

    def __init__(self) -> None:
        self.by_id: dict[str, Conn] = {}
        self._order: dict[str, int] = {}
        self._joined = 0
        #: READY or PREFETCH: the next dispatch owes them a task
        self._waiting: set[str] = set()
        #: frames queued since the last flush
        self._dirty: set[str] = set()
        #: when each non-empty outbox's head may go, and a heap of the same
        self._ready: dict[str, float] = {}
        self._ready_heap: list[tuple[float, int, str]] = []
        #: clients that declined a task lately -> when they may get one again
        self.cooling: dict[str, float] = {}

    # -- membership and phases -----------------------------------------------------

    def add(self, conn: Conn) -> None:
        """A new connection, READY."""
        cid = conn.client_id
        self.by_id[cid] = conn
        self._order[cid] = self._joined
        self._joined += 1
        self._waiting.add(cid)

    def remove(self, client_id: str) -> None:
        """The connection is gone (CLOSED); a no-op for one already removed."""
        conn = self.by_id.pop(client_id, None)
        if conn is not None:
            conn.move(ConnState.CLOSED)
        self._order.pop(client_id, None)
        self._waiting.discard(client_id)
        self._dirty.discard(client_id)
        self._ready.pop(client_id, None)
        self.cooling.pop(client_id, None)

    def released(self, client_id: str) -> None:
        """The lease book resolved the client's last lease: READY for work again."""
        conn = self.by_id.get(client_id)
        if conn is not None:
            conn.move(ConnState.READY)
            self._waiting.add(client_id)

    def leased(self, conn: Conn) -> None:
        """The client was leased a task (queued behind its current one if PREFETCH)."""
        conn.move(ConnState.WORKING)
        self._waiting.discard(conn.client_id)

    def prefetch(self, conn: Conn, msg: m.Prefetch, book: LeaseBook, *, pays: bool) -> None:
        """The client asks for its next task while it computes: PREFETCH, so the
        next dispatch queues one behind the task it names.

        Ignored (not an error: the two sides race) unless the connection was
        offered it (``conn.prefetch``: ``lease.prefetch``, ``Strategy.pipelined``,
        its link) and it ``pays`` now (TaskIssuer.prefetch_pays), the named task is
        the client's live lease and nothing is queued behind it yet.
        """
        cid = conn.client_id
        lease = book.live_lease_of(cid)
        if (
            conn.prefetch
            and pays
            and lease is not None
            and str(lease.task_id) == msg.task_id
            and book.queued_lease_of(cid) is None
        ):
            conn.move(ConnState.PREFETCH)
            self._waiting.add(cid)
        else:
            log.debug("client %s: prefetch for task %s ignored", cid, msg.task_id)

    def declined(self, client_id: str, in_row: int, now: float) -> None:
        """The client declined its ``in_row``-th task in a row: no task for it
        before a back-off that doubles with each."""
        backoff = DECLINE_BACKOFF_S * 2.0 ** min(in_row - 1, 32)
        self.cooling[client_id] = now + min(DECLINE_BACKOFF_MAX_S, backoff)

    def waiting(self, now: float) -> Iterator[Conn]:
        """Connections owed a task, in join order, bar those cooling until after
        ``now`` (a back-off that ran out is forgotten as it is passed). The set is
        taken when iteration starts; a client released meanwhile waits for the
        next dispatch."""
        cooling = self.cooling
        for client_id in self.in_join_order(self._waiting):
            until = cooling.get(client_id)
            if until is not None:
                if now < until:
                    continue  # next_wakeup brings it back
                del cooling[client_id]
            yield self.by_id[client_id]

    def has_waiting(self) -> bool:
        return bool(self._waiting)

    def in_join_order(self, client_ids: Iterable[str]) -> list[str]:
        return sorted(client_ids, key=self._order.__getitem__)

    # -- outbound frames -----------------------------------------------------------

    def queue(self, conn: Conn, msg: m.Message) -> int:
        """Append to the connection's outbox and mark it for the next flush;
        returns the frame's size (a task's is counted in ``TaskLeased``)."""
        frame = m.encode(msg)
        conn.outbox.push(ev.Send(client_id=conn.client_id, message=msg, frame=frame), len(frame))
        self._dirty.add(conn.client_id)
        return len(frame)

    def queue_frames(self, conn: Conn, frames: Iterable[tuple[m.Message, bytes]]) -> None:
        """Append already encoded frames (model chunks, shard data) likewise."""
        for msg, frame in frames:
            conn.outbox.push(
                ev.Send(client_id=conn.client_id, message=msg, frame=frame), len(frame)
            )
        self._dirty.add(conn.client_id)

    def flush_all(self, now: float, out: list[ev.Output]) -> None:
        """Flush, in join order, the connections with new frames or a head now due."""
        heap, ready = self._ready_heap, self._ready
        todo = self._dirty
        while heap and heap[0][0] <= now:
            t, _, client_id = heapq.heappop(heap)
            if ready.get(client_id) == t:
                todo.add(client_id)
        if not todo:
            return
        self._dirty = set()
        for client_id in self.in_join_order(todo):
            conn = self.by_id[client_id]
            conn.outbox.flush(now, out)  # type: ignore[arg-type]
            t = conn.outbox.next_send_time(max(now, 0.0))
            if t is not None:
                ready[client_id] = t
                heapq.heappush(heap, (t, self._order[client_id], client_id))
            else:
                ready.pop(client_id, None)

    def next_send_time(self) -> float | None:
        """When the earliest paced head may go (None: nothing waits for its link)."""
        heap, ready = self._ready_heap, self._ready
        while heap and ready.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)  # flushed or gone since
        return heap[0][0] if heap else None

    def next_cool_end(self) -> float | None:
        """When the earliest decline back-off of a client owed a task runs out. A
        cooling client that works on (it declined its running task and a prefetched
        one became current) needs no wakeup: ``waiting`` meets its back-off when it
        is released. Counting it kept the core's next wakeup in the past, and a
        driver ticking at once spun until that client's task ended."""
        waiting = self._waiting
        ends = [until for cid, until in self.cooling.items() if cid in waiting]
        return min(ends) if ends else None


def refusal(client_id: str, code: ErrorCode, message: str) -> list[ev.Output]:
    """An ``error`` frame (unpaced), then a Close with the code's close code."""
    err = m.Error(code=int(code), message=message)
    ps = ProtocolError(code, message)
    return [
        ev.Send(client_id=client_id, message=err, frame=m.encode(err)),
        ev.Close(client_id=client_id, code=ps.close_code, reason=message[:120]),
    ]


def finished_bye(client_id: str, detail: str) -> list[ev.Output]:
    """``bye`` with reason ``finished`` (do not reconnect) and why, then close 1000."""
    bye = m.Bye(reason=m.BYE_FINISHED, detail=detail)
    return [
        ev.Send(client_id=client_id, message=bye, frame=m.encode(bye)),
        ev.Close(client_id=client_id, code=CLOSE_NORMAL, reason=m.BYE_FINISHED),
    ]
