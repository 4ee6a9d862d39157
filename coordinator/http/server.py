"""The network side: a FastAPI app that moves websocket frames between clients and the core thread.

Theory of operation. ``/ws`` accepts binary msgpack frames (docs/protocol.md
§2). The first frame must be ``hello`` (with the join token when one is set);
frames are decoded here, on the asyncio thread, and handed to the
:class:`~coordinator.runtime.service.CoreService` queue. The core's outputs come back
through ``loop.call_soon_threadsafe`` once per core call and are sorted into
per-connection send queues. Heartbeats are echoed here at once (the core is
told not to echo), so a core busy merging never delays liveness. A peer's
misbehaviour caught here (bad bytes, a text frame, a wrong token) is answered
like the core does it: an ``error`` frame, then a close with the code
``protocol.errors`` maps it to. Nothing a peer sends can raise out of the
endpoint.

Each connection has one writer task draining a queue bounded in bytes. A
client that stops reading blocks the websocket send (uvicorn pauses writing
when the transport buffer is full), its queue grows past ``send_queue_bytes``
and it is closed with :data:`CLOSE_SLOW_CONSUMER`; its queued frames are
dropped, so the coordinator's memory stays bounded whatever clients do.

Cheap per frame, because one process holds thousands of connections: the core
thread's outputs reach the loop in batches (one ``call_soon_threadsafe`` per
batch, coalesced while one is pending); heartbeat echoes are packed straight
from the three numbers; uvicorn's websocket keepalive pings are off (our
heartbeats and the core's heartbeat deadline cover liveness, and a connection
that never says hello is closed after ``HELLO_TIMEOUT_S``); and the websocket
protocol (:class:`ReadAheadWebSocketProtocol`) stops pausing the socket after
every frame.

The app can be mounted into a host FastAPI/Starlette app. A mounted app's
lifespan does not run, so the service starts lazily on the first request, and
a host that wants a clean shutdown composes ``async with crowd:`` (or calls
``await crowd.drain()``) in its own lifespan.

Why long: the websocket and HTTP edge of one service (admission, per-peer
send queues and slow-consumer closes, TLS, the app's lifespan); the routes
and pages live in routes.py and dashboard.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import uvicorn
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from coordinator.core import events as ev
from coordinator.core.handshake import server_limits
from coordinator.http.admission import Admission, AdmissionLimits, http_protocol
from coordinator.http.dashboard import Dashboard
from coordinator.http.listen import bind, join_url
from coordinator.http.metrics import Metrics
from coordinator.http.routes import build_app
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
#: Default bound of a connection's send queue: several frames of a large model.
DEFAULT_SEND_QUEUE_BYTES = 32 * 1024 * 1024
#: Seconds a new connection has to send hello before it is closed (TIMEOUT); the
#: protocol's number (docs/protocol.md §6), a module global so tests can shorten it.
HELLO_TIMEOUT_S = m.HELLO_TIMEOUT_S
#: Frames uvicorn may queue for the app before it pauses reading the socket.
READ_AHEAD_FRAMES = 8
#: Seconds a refused connection is read (and discarded) before the socket closes.
CLOSE_LINGER_S = 2.0
#: Seconds a peer that does not read gets to answer our close frame before its
#: connection is reset: its send buffer is full, so a graceful close never ends.
CLOSE_ABORT_S = 5.0
#: Seconds HTTP requests still running after the drain get before they are cancelled.
SHUTDOWN_REQUESTS_S = 3.0
#: Largest websocket message a connection may send before its hello is taken
#: (docs/protocol.md §2, §8): a hello is a few hundred bytes, and without this an
#: unauthenticated peer had the link's whole maximum (64 MiB) buffered per frame.
#: Larger is refused by the websocket parser from the frame header, close 1009.
PRE_HELLO_MAX_BYTES = 64 * 1024
#: ASGI scope extension of :class:`ReadAheadWebSocketProtocol`: the app may send a
#: message of type :data:`LIFT_FRAME_CAP` to raise the cap to ``ws_max_size``.
FRAME_CAP_EXTENSION = "crowdgrad.frame_cap"
LIFT_FRAME_CAP = "crowdgrad.frame_cap.lift"


class ReadAheadWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-IO websocket protocol, pausing the socket only when the app
    is ``READ_AHEAD_FRAMES`` frames behind instead of after every frame.

    Upstream pauses reading on each received frame and resumes when the app
    takes it: two epoll changes per frame, measured at about a tenth of the
    coordinator's CPU under load. Back-pressure is kept, only looser: at most
    ``READ_AHEAD_FRAMES`` frames (plus those of one socket read) wait per
    connection, each at most ``ws_max_size``. ``receive`` (upstream) resumes
    once the queue is empty. Written against uvicorn 0.54's
    ``send_receive_event_to_app`` (the class exists since 0.35);
    tests/coordinator/test_server.py checks that it still pauses.

    It also turns Nagle's algorithm off (``TCP_NODELAY``): the sockets uvicorn
    hands over had it on, so a task written right after a small ``ack`` waited
    for the client's delayed ACK of that ack, up to 40 ms (benchmarks/flower.py's
    rounds: 47 ms each with it, 10 ms without).

    And it caps messages at :data:`PRE_HELLO_MAX_BYTES` until the app lifts the cap
    (``{"type": LIFT_FRAME_CAP}``, sent once the hello is taken): before that a
    peer is a stranger, and eight 64 MiB frames took the process from 334 to
    861 MB. The parser checks the limit against each frame's header, so a larger
    frame is refused (1009) before its payload is buffered. It reads the limit
    when the first bytes of a frame arrive: a client that waits for ``welcome``
    (§6) sends its next frame under the lifted limit, and a frame begun before
    the lift keeps the cap (as docs/protocol.md §2 warns).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        link_max = self.config.ws_max_size
        self._capped = link_max is None or link_max > PRE_HELLO_MAX_BYTES
        if self._capped:
            _set_max_message_size(self.conn, PRE_HELLO_MAX_BYTES)

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        if self._capped and self.response.status_code == 101:
            self.scope["extensions"][FRAME_CAP_EXTENSION] = {}  # type: ignore[index]

    def lift_frame_cap(self) -> None:
        """Frames up to ``ws_max_size`` from the next one on (the hello was taken)."""
        if self._capped:
            self._capped = False
            _set_max_message_size(self.conn, self.config.ws_max_size)

    def connection_made(self, transport: Any) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):  # the peer may be gone already
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)

    def send_receive_event_to_app(self) -> None:
        data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
        self.frames = []
        if self.close_sent:
            return  # past websocket.close: drop it, keep reading for the close reply
        if self.curr_msg_data_type == "text":
            try:
                self.queue.put_nowait({"type": "websocket.receive", "text": data.decode()})
            except UnicodeDecodeError:
                self.conn.send_close(1007)
                self.handle_parser_exception()
                return
        else:
            self.queue.put_nowait({"type": "websocket.receive", "bytes": data})
        if not self.read_paused and self.queue.qsize() >= READ_AHEAD_FRAMES:
            self.read_paused = True
            self.transport.pause_reading()

    def handle_parser_exception(self) -> None:
        """A frame the parser refused (over ``ws_max_size``, bad framing): send the
        close frame, then keep reading — the parser discards — until the peer
        closes, or ``CLOSE_LINGER_S``. Upstream closes the socket at once, and
        closing with the rest of a large frame unread makes the kernel reset the
        connection: the peer never sees the close code (RFC 6455 §7.1.1 asks the
        server to wait for the client to close the TCP connection)."""
        if self.close_sent:
            return  # more bytes of the refused frame: the parser discards them
        assert self.conn.close_sent is not None
        code, reason = self.conn.close_sent.code, self.conn.close_sent.reason
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()
        self.close_timer = self.loop.call_later(CLOSE_LINGER_S, self.transport.close)

    async def send(self, message: Any) -> None:
        """Upstream, plus: a close while the peer does not read (the transport paused
        writing, its buffer full) does not wait for the buffer to drain, which it
        never will. The close frame is queued behind the buffer and the connection
        is reset if the close handshake has not finished within ``CLOSE_ABORT_S``.
        Upstream waits in ``writable.wait()`` and the peer stays connected, its
        heartbeats still read, until it reads again.

        Also takes :data:`LIFT_FRAME_CAP`, at once (it never waits)."""
        if message["type"] == LIFT_FRAME_CAP:
            self.lift_frame_cap()
            return
        if (
            message["type"] == "websocket.close"
            and not self.writable.is_set()
            and self.handshake_complete
            and not self.close_sent
            and self.initial_response is None
            and not self.transport.is_closing()
        ):
            code, reason = message.get("code", 1000), message.get("reason", "") or ""
            self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
            self.conn.send_close(code, reason)
            self.transport.write(b"".join(self.conn.data_to_send()))
            self.close_sent = True
            if self.read_paused:
                self.read_paused = False
                self.transport.resume_reading()
            self.close_timer = self.loop.call_later(CLOSE_ABORT_S, self.transport.abort)
            return
        await super().send(message)


def _set_max_message_size(conn: Any, size: int | None) -> None:
    """websockets >= 15 names the limit ``max_message_size``; 13 and 14 ``max_size``.
    The parser reads it when a frame's first bytes arrive."""
    if hasattr(conn, "max_message_size"):
        conn.max_message_size = size
    else:
        conn.max_size = size


def heartbeat_echo(seq: int, now: float, echo: float) -> bytes:
    """The frame ``m.encode(m.Heartbeat(seq=seq, time=now, echo=echo))`` gives, packed
    without building the message (the hottest frame: one per client every few
    seconds); tests/coordinator/test_server.py holds them equal."""
    return msgpack.packb(
        {"type": "heartbeat", "seq": seq, "time": float(now), "echo": float(echo)},
        use_bin_type=True,
    )


class RawWebSocket:
    """The four calls the endpoint makes, straight on the ASGI channel.

    Starlette's ``WebSocket`` and the middleware stack a FastAPI route runs in
    wrap every send and receive and keep about a dozen objects alive per
    connection (an exit stack, headers, two request objects, a coroutine per
    middleware) for its whole life; at 10,000 connections those are what the
    collector walks. ``CrowdApp`` hands ``/ws`` here instead.
    """

    __slots__ = ("_receive", "_send", "client_ip", "frame_cap")

    def __init__(
        self,
        receive: Receive,
        send: Send,
        client_ip: str | None = None,
        *,
        frame_cap: bool = False,
    ) -> None:
        self._receive = receive
        self._send = send
        #: the peer's address as the server saw it (scope["client"]), for admission
        self.client_ip = client_ip
        #: the websocket layer caps frames until told (FRAME_CAP_EXTENSION)
        self.frame_cap = frame_cap

    async def accept(self) -> None:
        first = await self._receive()
        if first["type"] != "websocket.connect":
            raise RuntimeError(f"websocket: expected websocket.connect, got {first['type']!r}")
        await self._send({"type": "websocket.accept"})

    async def receive(self) -> dict[str, Any]:
        return await self._receive()  # type: ignore[return-value]

    async def send_bytes(self, data: bytes) -> None:
        await self._send({"type": "websocket.send", "bytes": data})

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self._send({"type": "websocket.close", "code": code, "reason": reason})

    async def lift_frame_cap(self) -> None:
        """Let the peer send frames up to the link's maximum (its hello was taken)."""
        if self.frame_cap:
            self.frame_cap = False
            await self._send({"type": LIFT_FRAME_CAP})  # type: ignore[typeddict-item]


class CrowdApp:
    """What uvicorn (or a host app's ``mount``) serves: websocket ``/ws`` goes to the
    endpoint directly, everything else (HTTP, lifespan, unknown paths) to the FastAPI
    app, whose attributes this forwards (``openapi()``, ``routes``...)."""

    def __init__(self, api: FastAPI, ws: Callable[[RawWebSocket], Any]) -> None:
        self.api = api
        self._ws = ws

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and _route_path(scope) == "/ws":
            client = scope.get("client")
            cap = FRAME_CAP_EXTENSION in (scope.get("extensions") or {})
            await self._ws(
                RawWebSocket(receive, send, client[0] if client else None, frame_cap=cap)
            )
        else:
            await self.api(scope, receive, send)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)


def _route_path(scope: Scope) -> str:
    """The path below the mount point (Starlette's ``Mount`` keeps the full path in
    ``path`` and the mount point in ``root_path``)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


@dataclass(slots=True, eq=False)
class _Peer:
    client_id: str
    ws: RawWebSocket
    bound: int
    queue: deque[bytes] = field(default_factory=deque)
    queued: int = 0
    max_queued: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    close: tuple[int, str] | None = None
    joined: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)
    writer: asyncio.Task[None] | None = None


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
        assert self.service.core is not None
        self.service.core.echo_heartbeats = False

    async def drain(self) -> None:
        """Stop accepting, stop the core (final tick + checkpoint), close every client
        with 1001 going away. Idempotent."""
        if self._drained:
            return
        self._drained = True
        self.accepting = False
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
        for o in outputs:
            match o:
                case ev.Send():
                    peer = self.peers.get(o.client_id)
                    if peer is not None:
                        self._enqueue(peer, o.frame)
                case ev.Close():
                    peer = self.peers.get(o.client_id)
                    if peer is not None:
                        peer.joined = False  # the core dropped it already
                        self._request_close(peer, o.code, o.reason)
                case _:
                    pass

    def _enqueue(self, peer: _Peer, frame: bytes) -> None:
        if peer.close is not None:
            return
        if peer.queue and peer.queued + len(frame) > peer.bound:
            self.net.slow_closed += 1
            self.dashboard.note("slow_consumer", f"{peer.client_id}: send queue full, closed 4017")
            log.info("client %s: send queue over %d bytes; closing", peer.client_id, peer.bound)
            peer.queue.clear()
            peer.queued = 0
            self._request_close(peer, CLOSE_SLOW_CONSUMER, "send queue full: not reading")
            # The writer is stuck behind the full socket: close from here instead.
            if peer.writer is not None:
                peer.writer.cancel()
            peer.writer = asyncio.ensure_future(self._close_now(peer))
            return
        peer.queue.append(frame)
        peer.queued += len(frame)
        peer.max_queued = max(peer.max_queued, peer.queued)
        self.net.max_queued = max(self.net.max_queued, peer.queued)
        peer.wake.set()

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
                    frame = peer.queue.popleft()
                    peer.queued -= len(frame)
                    await ws.send_bytes(frame)
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
        peer = _Peer(client_id=cid, ws=ws, bound=self.send_queue_bytes)
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
                self.service.submit_receive(peer.client_id, msg, len(data))
            except ProtocolError as exc:
                self._refuse(peer, exc)
                return f"closed: {exc.code.name}"
        return "closed by the coordinator"

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
        peer.queue.append(m.encode(err))
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
            "queued": sum(p.queued for p in list(self.peers.values())),
            "max_queued": self.net.max_queued,
            "acks_held": st.acks_held,
            "pending": core.strategy.pending() if core is not None else None,
            "step_scale": core.strategy.step_scale() if core is not None else None,
        }

    def stop_soon(self) -> None:
        """Drain and stop, from a request handler (the admin API's stop)."""

        async def go() -> None:
            await self.drain()
            if self.on_stop is not None:
                self.on_stop()

        self._stop_task = asyncio.ensure_future(go())


# -- running under uvicorn -------------------------------------------------------------


class _Uvicorn(uvicorn.Server):
    """uvicorn closes websockets with 1012 on shutdown; drain first so clients get 1001
    and the final checkpoint is written before connections go.

    ``stopping``, when set, is called as soon as a stop is asked for (a signal
    caught by uvicorn's handler, or any shutdown: admin stop, job done), so a
    driver can bound the whole stop (the CLI's ``--stop-grace`` watchdog)."""

    crowd: CrowdServer
    stopping: Callable[[], None] | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        if self.stopping is not None:
            self.stopping()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.stopping is not None:
            self.stopping()
        await self.crowd.drain()
        await super().shutdown(sockets)


def make_uvicorn(
    crowd: CrowdServer,
    *,
    log_level: str = "warning",
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
) -> uvicorn.Server:
    """A uvicorn server for ``crowd``; serve it with ``await server.serve(sockets=[sock])``.
    With a certificate and key it serves TLS (``wss://``, ``https://``) itself."""
    if (ssl_certfile is None) != (ssl_keyfile is None):
        raise ValueError("TLS needs both a certificate file and a key file")
    config = uvicorn.Config(
        crowd.app,
        # websockets-sansio, deliberately (the legacy "websockets" implementation
        # reached p99 1.65 s at 10,000 connections where sansio stayed at 59 ms,
        # design brief), less its pause-after-every-frame: see the class.
        ws=ReadAheadWebSocketProtocol,
        # a handshake deadline and per-address bounds (coordinator/http/admission.py)
        http=http_protocol(crowd.admission),
        ws_max_size=crowd.ws_max_size,
        # Off: clients heartbeat (the core closes the silent ones), and at 10,000
        # connections the pings are 500 timers/s on the loop that never find anything.
        ws_ping_interval=None,
        ws_ping_timeout=None,
        ws_per_message_deflate=False,  # frames are msgpack floats: nothing to gain
        lifespan="on",
        # After the drain (final checkpoint, clients closed with 1001), an HTTP
        # request still running (a stream, a stuck handler) gets this long, then
        # is cancelled: without a bound uvicorn waits for it forever.
        timeout_graceful_shutdown=SHUTDOWN_REQUESTS_S,
        log_level=log_level,
        access_log=False,
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
    )
    server = _Uvicorn(config)
    server.crowd = crowd
    crowd.on_stop = lambda: setattr(server, "should_exit", True)
    return server


class BackgroundServer:
    """uvicorn serving ``crowd`` on a thread of its own (tests, the demo, the Python API).

    ``with BackgroundServer(crowd) as bg: bg.url`` — leaving drains and stops it.
    """

    def __init__(
        self,
        crowd: CrowdServer,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
    ) -> None:
        self.crowd = crowd
        self.sock = bind(host, port)
        self.port = int(self.sock.getsockname()[1])
        tls = ssl_certfile is not None
        self.url = join_url(host, self.port, tls=tls)
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        self.http = f"{'https' if tls else 'http'}://{shown}:{self.port}"
        self.server = make_uvicorn(crowd, ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile)
        self._thread = threading.Thread(target=self._run, name="crowdgrad-net", daemon=True)

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def start(self, timeout: float = 300.0) -> BackgroundServer:
        """Serve on the thread; return once it listens. Starting builds the core,
        which on a cold numba cache compiles its kernels first (over 30 s on a busy
        2-core machine), hence the generous bound: it is a safety net, not a goal."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started and self._thread.is_alive():
            if time.monotonic() > deadline:
                break
            self._thread.join(0.01)
        if not self.server.started:
            raise RuntimeError(f"coordinator server did not start within {timeout:g} s")
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
