"""The websocket layer under ``/ws``: uvicorn's protocol with read-ahead and a
frame cap before hello, and the thin ASGI app that hands ``/ws`` to the endpoint.

``ReadAheadWebSocketProtocol`` pauses the socket only when ``READ_AHEAD_FRAMES``
frames wait (not after every frame), caps frames at ``PRE_HELLO_MAX_BYTES`` until
the endpoint lifts it, and after a refusal reads and discards for
``CLOSE_LINGER_S`` so the close frame reaches the peer. ``CrowdApp`` sends ``/ws``
straight to a ``RawWebSocket`` (four calls on the ASGI channel) and everything else
to FastAPI. The measurements behind each choice: docs/coordinator.md, "The server
driver".
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.protocol import State

from coordinator.http.transport import drop_transport_cycle

log = logging.getLogger(__name__)

#: Frames uvicorn may queue for the app before it pauses reading the socket.
READ_AHEAD_FRAMES = 8
#: Seconds a refused connection is read (and discarded) before the socket closes.
CLOSE_LINGER_S = 2.0
#: Seconds a peer that does not read gets to answer our close frame before its
#: connection is reset: its send buffer is full, so a graceful close never ends.
CLOSE_ABORT_S = 5.0
#: Largest websocket message a connection may send before its hello is taken
#: (docs/protocol.md §2, §8): a hello is a few hundred bytes, and without this an
#: unauthenticated peer had the link's whole maximum (64 MiB) buffered per frame;
#: at 64 KiB, 1,000 strangers' frames at once still cost 86 MB (benchmarks/prehello.py).
#: Larger is refused by the websocket parser from the frame header, close 1009.
PRE_HELLO_MAX_BYTES = 16 * 1024
#: ASGI scope extension of :class:`ReadAheadWebSocketProtocol`: the app may send a
#: message of type :data:`LIFT_FRAME_CAP` to raise the cap to ``ws_max_size``.
FRAME_CAP_EXTENSION = "crowdgrad.frame_cap"
LIFT_FRAME_CAP = "crowdgrad.frame_cap.lift"
#: ASGI scope extension of :class:`ReadAheadWebSocketProtocol`: ``{"send": fn}``, where
#: ``fn(frames)`` writes binary messages at once, synchronously (``send_now``).
SEND_NOW_EXTENSION = "crowdgrad.send_now"


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
        if self.response.status_code == 101:
            extensions = self.scope["extensions"]
            assert extensions is not None
            extensions[SEND_NOW_EXTENSION] = {"send": self.send_now}
            if self._capped:
                extensions[FRAME_CAP_EXTENSION] = {}

    def send_now(self, frames: list[bytes]) -> bool:
        """Write ``frames`` as binary messages now, in one transport write, and say
        whether it did: only where upstream's ``send`` of ``websocket.send`` would
        write them at once (handshake done, no close sent, not disconnected, the
        transport writable); otherwise nothing is written and the caller sends
        them through ``send``, which waits or raises as upstream does.

        The server's per-frame ``send`` is a coroutine chain and a ``transport.write``
        (a syscall) per message; a task round trip sends three messages together
        (ack, task, model chunk) and each heartbeat echo wakes a writer task.
        """
        if (
            not self.handshake_complete
            or self.close_sent
            or self.disconnected
            or self.initial_response is not None
            or not self.writable.is_set()
            or self.transport.is_closing()
            or self.conn.state is not State.OPEN
            or self.conn.expect_continuation_frame
        ):
            return False
        conn = self.conn
        for frame in frames:
            conn.send_binary(frame)
        self.transport.write(b"".join(conn.data_to_send()))
        return True

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

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        drop_transport_cycle(self.transport)
        drop_parser_cycle(self.conn)
        # the scope holds ``send_now``, a bound method of this protocol: a cycle
        extensions = getattr(self, "scope", {}).get("extensions") or {}
        extensions.pop(SEND_NOW_EXTENSION, None)

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


def drop_parser_cycle(conn: Any) -> None:
    """Unhook a websockets sans-IO protocol whose connection ended from itself.

    ``conn.parser`` is a generator of ``conn`` (``parse``, then ``discard``) whose
    suspended frame holds ``conn``: a reference cycle, so a closed connection's
    protocol, read buffer and event lists waited for a collection that reached
    them. ``crowdgrad.process.tune_gc`` freezes whatever is alive every second
    (the connections open then included) and collects frozen objects rarely, so
    under hostile churn they piled up (issue 34: about 16 blocks a hostile
    connection, RSS +17 % over 200,000 fuzz frames). CPython frees such a cycle
    by finalizing the generator, which is why ``gc.DEBUG_SAVEALL`` never listed
    it. ``conn.parser_exc`` (a frame the parser refused) holds the same frame
    through its traceback. Called from ``connection_lost``: no bytes reach the
    parser after it, and a closed generator is what the collector would leave."""
    parser = getattr(conn, "parser", None)
    if parser is not None:
        parser.close()
    exc: BaseException | None = getattr(conn, "parser_exc", None)
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:  # each traceback of the chain
        seen.add(id(exc))
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


def _set_max_message_size(conn: Any, size: int | None) -> None:
    """websockets >= 15 names the limit ``max_message_size``; 13 and 14 ``max_size``.
    The parser reads it when a frame's first bytes arrive."""
    if hasattr(conn, "max_message_size"):
        conn.max_message_size = size
    else:
        conn.max_size = size


class RawWebSocket:
    """The four calls the endpoint makes, straight on the ASGI channel.

    Starlette's ``WebSocket`` and the middleware stack a FastAPI route runs in
    wrap every send and receive and keep about a dozen objects alive per
    connection (an exit stack, headers, two request objects, a coroutine per
    middleware) for its whole life; at 10,000 connections those are what the
    collector walks. ``CrowdApp`` hands ``/ws`` here instead.
    """

    __slots__ = ("_receive", "_send", "client_ip", "frame_cap", "send_now")

    def __init__(
        self,
        receive: Receive,
        send: Send,
        client_ip: str | None = None,
        *,
        frame_cap: bool = False,
        send_now: Callable[[list[bytes]], bool] | None = None,
    ) -> None:
        self._receive = receive
        self._send = send
        #: the peer's address as the server saw it (scope["client"]), for admission
        self.client_ip = client_ip
        #: the websocket layer caps frames until told (FRAME_CAP_EXTENSION)
        self.frame_cap = frame_cap
        #: writes binary messages at once when it can (SEND_NOW_EXTENSION; None
        #: under a server without it: every message goes through ``send_bytes``)
        self.send_now = send_now

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
            extensions = scope.get("extensions") or {}
            now = extensions.get(SEND_NOW_EXTENSION)
            await self._ws(
                RawWebSocket(
                    receive,
                    send,
                    client[0] if client else None,
                    frame_cap=FRAME_CAP_EXTENSION in extensions,
                    send_now=None if now is None else now["send"],
                )
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
