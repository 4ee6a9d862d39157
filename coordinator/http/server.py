"""The network side: moves websocket frames between clients and the core thread.

``/ws`` takes binary msgpack frames (docs/protocol.md §2), the first a ``hello``
(with the join token when one is set); frames are decoded here, on the asyncio
thread, and handed to the ``CoreService`` queue, and the core's outputs come back
in batches (one ``call_soon_threadsafe`` per batch) into per-connection send
queues. Heartbeats are echoed here at once, so a core busy merging never delays
liveness. A peer's misbehaviour caught here is answered as the core does it (an
``error`` frame, then the mapped close code); nothing a peer sends raises out of
the endpoint. Each connection's queue is bounded in bytes: a client that stops
reading is closed with ``CLOSE_SLOW_CONSUMER`` and its frames dropped. Transfers
a client asked for (model chunks, shard data: paced by the core at the link's
rate, which a busy honest reader may lag) have room of their own beside that
bound, two of the largest, so a slow reader of a large model is not mistaken for
one that does not read.

The app can be mounted into a host FastAPI/Starlette app: its lifespan does not
run there, so the service starts on the first request, and the host composes
``async with crowd:`` (or ``await crowd.drain()``) into its own. The websocket
layer is in wsasgi.py, uvicorn in serving.py, the routes in routes.py; the
measurements: docs/coordinator.md, "The server driver".
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from coordinator.core import events as ev
from coordinator.core.handshake import server_limits
from coordinator.http.admission import Admission, AdmissionLimits
from coordinator.http.dashboard import Dashboard
from coordinator.http.metrics import Metrics
from coordinator.http.routes import build_app
from coordinator.http.wsasgi import (
    CrowdApp,
    RawWebSocket,
)
from coordinator.runtime.service import CoreService
from protocol import messages as m
from protocol.errors import CLOSE_UNSUPPORTED_DATA, ErrorCode, ProtocolError, close_code

log = logging.getLogger(__name__)

#: Close code for a client whose send queue overflowed because it does not read.
CLOSE_SLOW_CONSUMER = close_code(ErrorCode.SLOW_CONSUMER)
#: Close code and reason when the coordinator shuts down (RFC 6455 §7.4.1).
CLOSE_GOING_AWAY = 1001
#: Room above max_message_bytes for the msgpack envelope and websocket header.
ENVELOPE_MARGIN = 64 * 1024
#: Default bound of a connection's send queue (its own frames: acks, tasks, echoes).
DEFAULT_SEND_QUEUE_BYTES = 32 * 1024 * 1024
#: Frames of transfers a client asks for; they queue in the room of ``bulk_room``.
BULK_MESSAGES: tuple[type[m.Message], ...] = (m.Chunk, m.Data)
#: Seconds a new connection has to send hello before it is closed (TIMEOUT); the
#: protocol's number (docs/protocol.md §6), a module global so tests can shorten it.
HELLO_TIMEOUT_S = m.HELLO_TIMEOUT_S
#: Seconds a heartbeat may wait on the network thread to reach the core with those
#: after it (its echo is sent at once): 10,000 clients' 2,000 heartbeats a second
#: then wake the core thread about 100 times a second, not 2,000. Any other frame
#: goes at once, with the heartbeats gathered before it (their order kept).
HEARTBEAT_HANDOVER_S = 0.01


def heartbeat_echo(seq: int, now: float, echo: float) -> bytes:
    """The frame ``m.encode(m.Heartbeat(seq=seq, time=now, echo=echo))`` gives, packed
    without building the message (the hottest frame: one per client every few
    seconds); tests/coordinator/test_server.py holds them equal."""
    return msgpack.packb(
        {"type": "heartbeat", "seq": seq, "time": float(now), "echo": float(echo)},
        use_bin_type=True,
    )


def bulk_room(model_bytes: int, largest_shard_bytes: int, bound: int) -> int:
    """Bytes of transfer frames a connection may have queued: its bound plus two
    of the largest transfer (a task's model and a prefetched one; a shard), their
    frames' envelopes included. The core sends a client a model only for a task it
    leased and a shard only for one of its tasks, so an honest reader never holds
    more; a peer that does not read passes it and is closed."""
    largest = max(model_bytes, largest_shard_bytes)
    return bound + 2 * (largest + largest // 16)


@dataclass(slots=True, eq=False)
class _Peer:
    client_id: str
    ws: RawWebSocket
    bound: int
    #: bytes of transfer frames (``BULK_MESSAGES``) it may hold queued
    room: int
    #: frames and whether each is a transfer's (counted in ``bulk`` not ``queued``)
    queue: deque[tuple[bytes, bool]] = field(default_factory=deque)
    queued: int = 0
    bulk: int = 0
    max_queued: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    close: tuple[int, str] | None = None
    joined: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)
    writer: asyncio.Task[None] | None = None
    #: the writer is inside ``send_bytes`` with a frame taken off the queue: nothing
    #: may be written past it (``_send_now``) until it is out
    sending: bool = False


@dataclass(slots=True)
class NetStats:
    frames_in: int = 0
    frames_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    refused: int = 0
    slow_closed: int = 0
    #: largest send queue any connection reached (bytes)
    max_queued: int = 0


class CrowdServer:
    """The FastAPI app plus its connections; ``app`` is what uvicorn (or a host) serves
    (a ``CrowdApp``: ``/ws`` directly, the rest through FastAPI)."""

    def __init__(
        self,
        service: CoreService,
        *,
        join_token: str | None = None,
        admin_token: str | None = None,
        send_queue_bytes: int = DEFAULT_SEND_QUEUE_BYTES,
        on_stop: Callable[[], None] | None = None,
        admission: AdmissionLimits | None = None,
    ) -> None:
        if send_queue_bytes < 1024:
            raise ValueError(f"send_queue_bytes: must be >= 1024, got {send_queue_bytes}")
        self.service = service
        # An empty token is no token: "CROWDGRAD_ADMIN_TOKEN=" must not open the API
        # to anyone who sends an empty one (nor make joining need an empty one).
        self.join_token = join_token or None
        self.admin_token = admin_token or None
        self.send_queue_bytes = send_queue_bytes
        self.on_stop = on_stop
        self.admission = Admission(admission)
        self.max_message_bytes = server_limits(service.job).max_message_bytes
        #: transfer room per connection (``bulk_room``), set when the core is up
        self.room = send_queue_bytes
        self.net = NetStats()
        self.peers: dict[str, _Peer] = {}
        self.metrics = Metrics(read=self._readings)
        self.dashboard = Dashboard()
        self.accepting = True
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        # Core outputs waiting for the loop; ``_scheduled``: a delivery is on its way.
        self._inbound: list[ev.Output] = []
        self._inbound_lock = threading.Lock()
        self._scheduled = False
        # Client messages not yet handed to the core (heartbeats), and the timer that will.
        self._received: list[tuple[str, m.Message, int]] = []
        self._handover: asyncio.TimerHandle | None = None
        self._drained = False
        self._stop_task: asyncio.Future[None] | None = None
        self.app = CrowdApp(build_app(self), self._endpoint)

    # -- lifecycle -----------------------------------------------------------------

    @property
    def ws_max_size(self) -> int:
        """What uvicorn's ``ws_max_size`` must be: larger frames are refused with 1009
        (before the hello is taken, those over :data:`PRE_HELLO_MAX_BYTES`)."""
        return self.max_message_bytes + ENVELOPE_MARGIN

    @property
    def draining(self) -> bool:
        """Stopping: no new connections, the streams end."""
        return self._drained

    def ensure_started(self) -> None:
        """Start the core thread bound to the running loop (first request, or lifespan)."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self.service.add_sink(self.metrics)
        self.service.add_sink(self.dashboard)
        self.service.traffic = lambda: (self.net.bytes_in, self.net.bytes_out)
        self.service.checkpoint_observers.append(self.metrics.checkpoint_seconds.observe)
        self.service.add_sink(self._from_core)
        self.service.start()
        # Echoed in _read_loop, at once. No client frame reaches the core before
        # this returns: they are submitted from this loop.
        core = self.service.core
        assert core is not None
        core.echo_heartbeats = False
        shards = max((len(s.blob) for s in core.data.shards), default=0)
        self.room = bulk_room(self.service.job.spec.nbytes, shards, self.send_queue_bytes)

    async def drain(self) -> None:
        """Stop accepting, stop the core (final tick + checkpoint), close every client
        with 1001 going away. Idempotent."""
        if self._drained:
            return
        self._drained = True
        self.accepting = False
        self._hand_over()
        if self._loop is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.service.stop)
        for peer in list(self.peers.values()):
            self._request_close(peer, CLOSE_GOING_AWAY, "going away")
        waits = [p.done.wait() for p in self.peers.values()]
        if waits:
            await asyncio.wait([asyncio.ensure_future(w) for w in waits], timeout=5.0)

    async def __aenter__(self) -> CrowdServer:
        self.ensure_started()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.drain()

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        async with self:
            yield

    # -- core outputs (core thread -> loop) ------------------------------------------

    def _from_core(self, outputs: list[ev.Output]) -> None:
        """Core thread: queue for the loop, waking it only if no delivery is pending
        (each wake is a syscall and a loop iteration)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with self._inbound_lock:
            self._inbound += outputs
            if self._scheduled:
                return
            self._scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop closed since the check
            loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._inbound_lock:
            outputs, self._inbound = self._inbound, []
            self._scheduled = False
        touched: dict[str, _Peer] = {}
        for o in outputs:
            match o:
                case ev.Send():
                    peer = self.peers.get(o.client_id)
                    if peer is not None:
                        self._enqueue(peer, o.frame, isinstance(o.message, BULK_MESSAGES))
                        touched[o.client_id] = peer
                case ev.Close():
                    peer = self.peers.get(o.client_id)
                    if peer is not None:
                        peer.joined = False  # the core dropped it already
                        self._request_close(peer, o.code, o.reason)
                case _:
                    pass
        for peer in touched.values():  # a peer's frames of the batch in one write
            self._flush(peer)

    def _flush(self, peer: _Peer) -> None:
        """Write the peer's queued frames now if its socket takes them, else leave
        them to its writer (it also sends the close after them)."""
        if peer.close is not None or not self._send_now(peer):
            peer.wake.set()

    def _send_now(self, peer: _Peer) -> bool:
        """All of the peer's queue in one write, at once, when nothing is ahead of it
        (the writer is not inside a send) and the websocket layer can
        (``RawWebSocket.send_now``); says whether it did."""
        send_now = peer.ws.send_now
        if send_now is None or peer.sending or not peer.queue:
            return False
        frames = [frame for frame, _ in peer.queue]
        if not send_now(frames):
            return False
        peer.queue.clear()
        peer.queued = peer.bulk = 0
        self.net.frames_out += len(frames)
        self.net.bytes_out += sum(map(len, frames))
        return True

    def _enqueue(self, peer: _Peer, frame: bytes, bulk: bool = False) -> None:
        """Queue ``frame``; a ``bulk`` one (a transfer's) counts against the peer's
        transfer room, any other against its bound. Past either: closed 4017."""
        if peer.close is not None:
            return
        held, limit = (peer.bulk, peer.room) if bulk else (peer.queued, peer.bound)
        if peer.queue and held + len(frame) > limit:
            self.net.slow_closed += 1
            self.dashboard.note("slow_consumer", f"{peer.client_id}: send queue full, closed 4017")
            what = "transfer frames" if bulk else "send queue"
            log.info("client %s: %s over %d bytes; closing", peer.client_id, what, limit)
            peer.queue.clear()
            peer.queued = peer.bulk = 0
            self._request_close(peer, CLOSE_SLOW_CONSUMER, "send queue full: not reading")
            # The writer is stuck behind the full socket: close from here instead.
            if peer.writer is not None:
                peer.writer.cancel()
            peer.writer = asyncio.ensure_future(self._close_now(peer))
            return
        peer.queue.append((frame, bulk))
        if bulk:
            peer.bulk += len(frame)
        else:
            peer.queued += len(frame)
            peer.max_queued = max(peer.max_queued, peer.queued)
            self.net.max_queued = max(self.net.max_queued, peer.queued)

    def _request_close(self, peer: _Peer, code: int, reason: str) -> None:
        if peer.close is None:
            peer.close = (code, reason[:120])
        peer.wake.set()

    async def _close_now(self, peer: _Peer) -> None:
        assert peer.close is not None
        with contextlib.suppress(Exception):
            await peer.ws.close(*peer.close)

    # -- the websocket endpoint ------------------------------------------------------

    async def _writer(self, peer: _Peer) -> None:
        ws = peer.ws
        try:
            while True:
                while peer.queue:
                    if self._send_now(peer):
                        break
                    frame, bulk = peer.queue.popleft()
                    if bulk:
                        peer.bulk -= len(frame)
                    else:
                        peer.queued -= len(frame)
                    peer.sending = True
                    await ws.send_bytes(frame)
                    peer.sending = False
                    self.net.frames_out += 1
                    self.net.bytes_out += len(frame)
                if peer.close is not None:
                    break
                peer.wake.clear()
                await peer.wake.wait()
        except Exception:  # the socket died under us; the reader notices too
            return
        code, reason = peer.close
        with contextlib.suppress(Exception):
            await ws.close(code, reason)

    async def _endpoint(self, ws: RawWebSocket) -> None:
        self.ensure_started()
        try:
            await ws.accept()
        except Exception:  # gone before the handshake finished: nothing to serve
            return
        if not self.accepting:
            await ws.close(CLOSE_GOING_AWAY, "going away")
            return
        if ws.client_ip is not None and not self.admission.session_allowed(ws.client_ip):
            await ws.close(
                close_code(ErrorCode.RATE_LIMITED),
                f"too many new sessions from {ws.client_ip}: "
                f"{self.admission.limits.hellos_per_ip_per_s:g}/s allowed",
            )
            return
        cid = f"c{next(self._ids)}"
        peer = _Peer(client_id=cid, ws=ws, bound=self.send_queue_bytes, room=self.room)
        self.peers[cid] = peer
        peer.writer = asyncio.create_task(self._writer(peer))
        reason = "connection closed"
        try:
            reason = await self._read_loop(peer)
        except Exception:  # our bug; never let it escape to uvicorn
            log.exception("client %s: endpoint error", cid)
            self._refuse(peer, ProtocolError(ErrorCode.INTERNAL, "internal error"))
        finally:
            if peer.joined:
                self._hand_over()  # its frames before its disconnect
                self.service.submit_disconnect(cid, reason)
            if peer.close is None:
                peer.close = (1000, "")
            peer.wake.set()
            writer = peer.writer
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(writer), timeout=2.0)
            if not writer.done():
                writer.cancel()  # a peer that never reads: drop it, queue and all
            self.peers.pop(cid, None)
            self.net.max_queued = max(self.net.max_queued, peer.max_queued)
            peer.done.set()

    async def _read_loop(self, peer: _Peer) -> str:
        """Read until the socket or the core ends the connection; returns why."""
        ws = peer.ws
        try:
            first = await asyncio.wait_for(ws.receive(), HELLO_TIMEOUT_S)
        except TimeoutError:
            self._refuse(peer, ProtocolError(ErrorCode.TIMEOUT, "no hello in time"))
            return "no hello"
        while peer.close is None:
            if first is not None:
                event, first = first, None
            else:
                event = await ws.receive()
            kind = event["type"]
            if kind == "websocket.disconnect":
                return f"disconnected ({event.get('code', 1006)})"
            if peer.close is not None:
                break  # closing: nothing more from this peer reaches the core
            data = event.get("bytes")
            if data is None:
                self.net.refused += 1
                self._send_error(peer, ErrorCode.MALFORMED, "text frames are not accepted")
                self._request_close(peer, CLOSE_UNSUPPORTED_DATA, "binary frames only")
                return "text frame"
            self.net.frames_in += 1
            self.net.bytes_in += len(data)
            try:
                msg = m.decode(data, max_bytes=self.max_message_bytes)
                self.metrics.frame_in(msg.TYPE, len(data))
                if not peer.joined:
                    self._hello(peer, msg)
                    # Before welcome is written: its frames are the link's from here.
                    await ws.lift_frame_cap()
                    continue
                if isinstance(msg, m.Heartbeat):
                    # Echoed here, not by the core: liveness must not wait behind a
                    # busy core. The core still sees it (last_seen, rate limits) but
                    # does not echo it (echo_heartbeats is off).
                    now = time.monotonic()
                    if msg.echo is not None and msg.held is not None:  # §3.7
                        self.metrics.heartbeat_rtt(now - msg.echo - msg.held)
                    echo = heartbeat_echo(msg.seq, now, msg.time)
                    self.metrics.frame_out("heartbeat", len(echo))
                    self._enqueue(peer, echo)
                    self._flush(peer)
                self._submit(peer.client_id, msg, len(data))
            except ProtocolError as exc:
                self._refuse(peer, exc)
                return f"closed: {exc.code.name}"
        return "closed by the coordinator"

    def _submit(self, client_id: str, msg: m.Message, nbytes: int) -> None:
        """Hand a client's message to the core: a heartbeat within
        ``HEARTBEAT_HANDOVER_S``, with the others; anything else at once, after them."""
        self._received.append((client_id, msg, nbytes))
        if type(msg) is not m.Heartbeat:
            self._hand_over()
        elif self._handover is None:
            loop = asyncio.get_running_loop()
            self._handover = loop.call_later(HEARTBEAT_HANDOVER_S, self._hand_over)

    def _hand_over(self) -> None:
        """Everything ``_submit`` gathered, to the core in one hand-over, in order."""
        if self._handover is not None:
            self._handover.cancel()
            self._handover = None
        received, self._received = self._received, []
        if len(received) == 1:
            self.service.submit_receive(*received[0])
        elif received:
            self.service.submit_receives(received)

    def _hello(self, peer: _Peer, msg: m.Message) -> None:
        if not isinstance(msg, m.Hello):
            raise ProtocolError(ErrorCode.UNEXPECTED, f"{msg.TYPE}: the first frame must be hello")
        if self.join_token is not None and not hmac.compare_digest(
            (msg.token or "").encode(), self.join_token.encode()
        ):
            raise ProtocolError(ErrorCode.AUTH_FAILED, "hello.token: join token refused")
        peer.joined = True
        self.service.submit_connect(peer.client_id, msg, peer.ws.client_ip)

    def _send_error(self, peer: _Peer, code: ErrorCode, message: str) -> None:
        err = m.Error(code=int(code), message=message[:1024])
        peer.queue.append((m.encode(err), False))
        peer.wake.set()

    def _refuse(self, peer: _Peer, exc: ProtocolError) -> None:
        self.net.refused += 1
        log.info("client %s refused: %s", peer.client_id, exc)
        if peer.close is None:
            self._send_error(peer, exc.code, exc.message)
        self._request_close(peer, close_code(exc.code), exc.message)

    def _readings(self) -> dict[str, Any]:
        """State gauges for /metrics, read at scrape time."""
        st = self.service.stats
        core = self.service.core
        return {
            "version": st.version,
            "queued": sum(p.queued + p.bulk for p in list(self.peers.values())),
            "max_queued": self.net.max_queued,
            "acks_held": st.acks_held,
            "pending": core.strategy.pending() if core is not None else None,
            "step_scale": core.strategy.step_scale() if core is not None else None,
            "outer_lr": core.strategy.round_outer_lr() if core is not None else None,
        }

    def stop_soon(self) -> None:
        """Drain and stop, from a request handler (the admin API's stop)."""

        async def go() -> None:
            await self.drain()
            if self.on_stop is not None:
                self.on_stop()

        self._stop_task = asyncio.ensure_future(go())
