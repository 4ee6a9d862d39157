"""The server's per-frame fast paths: heartbeat echo bytes, read-ahead back-pressure,
the hello deadline, keepalive pings off."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from uvicorn.config import Config
from uvicorn.server import ServerState
from websockets.asyncio.client import connect
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame
from websockets.protocol import State
from websockets.uri import parse_uri

from coordinator.core.config import parse_job
from coordinator.http import server as srv
from coordinator.http import wsasgi
from coordinator.http.server import CrowdServer, heartbeat_echo
from coordinator.http.serving import BackgroundServer, make_uvicorn
from coordinator.http.wsasgi import READ_AHEAD_FRAMES, ReadAheadWebSocketProtocol
from coordinator.runtime.service import CoreService
from protocol import messages as m
from protocol.errors import ErrorCode, close_code

JOB = {"model": {"widths": [64, 3, 10]}, "data": {"shards": 2, "batch": 2}}

finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e15, max_value=1e15)


@given(seq=st.integers(0, 2**63 - 1), now=finite, echo=finite)
def test_heartbeat_echo_is_the_encoded_message(seq: int, now: float, echo: float) -> None:
    assert heartbeat_echo(seq, now, echo) == m.encode(m.Heartbeat(seq=seq, time=now, echo=echo))


def test_keepalive_pings_and_compression_are_off() -> None:
    server = make_uvicorn(CrowdServer(CoreService(parse_job(JOB))))
    assert server.config.ws_ping_interval is None
    assert server.config.ws_per_message_deflate is False
    assert server.config.ws is ReadAheadWebSocketProtocol


async def _parked_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Accepts, then never reads: frames pile up in the protocol's queue."""
    assert scope["type"] == "websocket"
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    await asyncio.sleep(30)


def test_read_ahead_pauses_only_when_the_app_falls_behind() -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        config = Config(app=_parked_app, ws=ReadAheadWebSocketProtocol, lifespan="off")
        config.load()
        proto = ReadAheadWebSocketProtocol(config, ServerState(), {}, _loop=loop)
        ours, theirs = socket.socketpair()
        await loop.connect_accepted_socket(lambda: proto, ours)
        theirs.setblocking(False)
        peer = ClientProtocol(parse_uri("ws://x/ws"))
        peer.send_request(peer.connect())

        async def push(frames: int) -> None:
            for _ in range(frames):
                peer.send_binary(b"x" * 10)
            await loop.sock_sendall(theirs, b"".join(peer.data_to_send()))
            for _ in range(100):  # until the server has parsed them
                await asyncio.sleep(0.01)
                if proto.queue.qsize() >= expected:
                    return

        expected = 1  # websocket.connect, taken by the app
        await push(0)
        while peer.state is not State.OPEN:  # the 101 response
            peer.receive_data(await loop.sock_recv(theirs, 65536))
        expected = READ_AHEAD_FRAMES - 1
        await push(READ_AHEAD_FRAMES - 1)
        assert proto.queue.qsize() == READ_AHEAD_FRAMES - 1
        assert not proto.read_paused  # upstream pauses after the first frame
        expected = READ_AHEAD_FRAMES
        await push(1)
        assert proto.read_paused
        for _ in range(READ_AHEAD_FRAMES):
            await proto.receive()
        assert not proto.read_paused  # resumed once the app caught up
        proto.transport.close()
        theirs.close()
        for task in list(proto.tasks):
            task.cancel()

    asyncio.run(go())


async def _open_pair(
    loop: asyncio.AbstractEventLoop, ws_max_size: int
) -> tuple[ReadAheadWebSocketProtocol, ClientProtocol, socket.socket]:
    """The protocol on one end of a socketpair, a sans-IO client past the handshake on
    the other, the app parked."""
    config = Config(
        app=_parked_app, ws=ReadAheadWebSocketProtocol, lifespan="off", ws_max_size=ws_max_size
    )
    config.load()
    proto = ReadAheadWebSocketProtocol(config, ServerState(), {}, _loop=loop)
    ours, theirs = socket.socketpair()
    await loop.connect_accepted_socket(lambda: proto, ours)
    theirs.setblocking(False)
    peer = ClientProtocol(parse_uri("ws://x/ws"))
    peer.send_request(peer.connect())
    await loop.sock_sendall(theirs, b"".join(peer.data_to_send()))
    while peer.state is not State.OPEN:  # the 101 response
        peer.receive_data(await loop.sock_recv(theirs, 65536))
    return proto, peer, theirs


async def _until(pred: Any) -> bool:
    for _ in range(1000):  # a hang guard (10 s), not the claim
        if pred():
            return True
        await asyncio.sleep(0.01)
    return False


def _close_pair(proto: ReadAheadWebSocketProtocol, theirs: socket.socket) -> None:
    proto.transport.close()
    theirs.close()
    for task in list(proto.tasks):
        task.cancel()


def test_the_pre_hello_cap_lifts_for_the_next_frame_unless_it_has_begun() -> None:
    """The parser reads the size limit when a frame's first bytes arrive. Nothing of
    the frame after the hello came before the lift (a client waiting for welcome):
    a large one is taken. A byte of it came with the hello: it keeps the cap, 1009
    (docs/protocol.md §2)."""
    big = b"x" * (4 * wsasgi.PRE_HELLO_MAX_BYTES)

    async def go() -> None:
        loop = asyncio.get_running_loop()
        proto, peer, theirs = await _open_pair(loop, 1 << 20)
        assert wsasgi.FRAME_CAP_EXTENSION in proto.scope["extensions"]
        peer.send_binary(b"hello")
        await loop.sock_sendall(theirs, b"".join(peer.data_to_send()))
        assert await _until(lambda: proto.queue.qsize() == 1)
        await proto.send({"type": wsasgi.LIFT_FRAME_CAP})
        peer.send_binary(big)
        await loop.sock_sendall(theirs, b"".join(peer.data_to_send()))
        assert await _until(lambda: proto.queue.qsize() == 2 or proto.close_sent)
        assert proto.conn.close_sent is None
        assert (await proto.receive())["bytes"] == b"hello"
        assert (await proto.receive())["bytes"] == big
        _close_pair(proto, theirs)

        proto, peer, theirs = await _open_pair(loop, 1 << 20)
        peer.send_binary(b"hello")
        hello = b"".join(peer.data_to_send())
        peer.send_binary(big)
        rest = b"".join(peer.data_to_send())
        await loop.sock_sendall(theirs, hello + rest[:1])
        assert await _until(lambda: proto.queue.qsize() == 1)
        proto.lift_frame_cap()
        await loop.sock_sendall(theirs, rest[1:])
        assert await _until(lambda: proto.close_sent)
        assert proto.conn.close_sent is not None and proto.conn.close_sent.code == 1009
        _close_pair(proto, theirs)

        # A link no larger than the cap is not capped at all.
        proto, peer, theirs = await _open_pair(loop, wsasgi.PRE_HELLO_MAX_BYTES)
        assert wsasgi.FRAME_CAP_EXTENSION not in proto.scope["extensions"]
        _close_pair(proto, theirs)

    asyncio.run(go())


def test_websocket_connections_send_without_nagle() -> None:
    """A listening socket made with proto 0 (as make_uvicorn's is) accepts sockets
    asyncio does not set TCP_NODELAY on; with Nagle on, a task written right after
    an ack waited for the client's delayed ACK of it (up to 40 ms a round)."""

    async def go() -> None:
        loop = asyncio.get_running_loop()
        config = Config(app=_parked_app, ws=ReadAheadWebSocketProtocol, lifespan="off")
        config.load()
        proto = ReadAheadWebSocketProtocol(config, ServerState(), {}, _loop=loop)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            theirs = socket.create_connection(listener.getsockname())
            ours, _ = listener.accept()
        assert ours.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        transport, _ = await loop.connect_accepted_socket(lambda: proto, ours)
        await asyncio.sleep(0)  # connection_made runs soon after
        sock = transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        transport.close()
        theirs.close()
        for task in list(proto.tasks):
            task.cancel()

    asyncio.run(go())


def test_a_connection_without_hello_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(srv, "HELLO_TIMEOUT_S", 0.3)

    async def silent(url: str) -> tuple[int | None, list[m.Message]]:
        got: list[m.Message] = []
        async with connect(url, compression=None) as ws:
            try:
                while True:
                    got.append(m.decode(await asyncio.wait_for(ws.recv(), 10)))
            except ConnectionClosed as exc:
                return (exc.rcvd.code if exc.rcvd else None), got
        return None, got

    service = CoreService(parse_job(JOB))
    with BackgroundServer(CrowdServer(service)) as bg:
        code, got = asyncio.run(silent(bg.url))
    assert code == close_code(ErrorCode.TIMEOUT)
    assert [x.code for x in got if isinstance(x, m.Error)] == [ErrorCode.TIMEOUT]


def test_send_now_writes_messages_at_once_in_one_write_or_not_at_all() -> None:
    """``send_now``: the frames upstream's ``send`` would write, in one transport write;
    nothing where ``send`` would wait (the peer not reading) or refuse (closing)."""

    async def go() -> None:
        loop = asyncio.get_running_loop()
        proto, peer, theirs = await _open_pair(loop, 1 << 20)
        ext = proto.scope["extensions"][wsasgi.SEND_NOW_EXTENSION]
        assert ext["send"] == proto.send_now
        writes: list[bytes] = []
        write = proto.transport.write
        proto.transport.write = lambda data: (writes.append(data), write(data))  # type: ignore[method-assign]
        frames = [b"ack", b"task" * 100, b"c" * 70_000]  # 7-, 16- and 64-bit lengths
        assert proto.send_now(frames)
        assert len(writes) == 1
        got: list[bytes] = []
        while len(got) < 3:
            peer.receive_data(await loop.sock_recv(theirs, 1 << 20))
            got += [e.data for e in peer.events_received() if isinstance(e, Frame)]
        assert got == frames
        proto.pause_writing()  # the peer stopped reading: send() would wait
        assert not proto.send_now([b"late"])
        proto.resume_writing()
        await proto.send({"type": "websocket.close", "code": 1000})
        assert not proto.send_now([b"after close"])
        assert len(writes) == 2  # the close frame alone
        _close_pair(proto, theirs)

    asyncio.run(go())


class _FakeWs:
    """What CrowdServer's delivery needs of a RawWebSocket: ``send_now``, recorded."""

    def __init__(self, ok: bool = True) -> None:
        self.ok = ok
        self.calls: list[list[bytes]] = []

    def send_now(self, frames: list[bytes]) -> bool:
        self.calls.append(list(frames))
        return self.ok


def test_a_batch_goes_out_in_one_write_per_client_and_never_past_the_writer() -> None:
    """The core's outputs for one client in one batch (an ack, its next task, the
    model chunk) leave in one ``send_now``; while its writer is inside a send, or
    when the socket would not take them, they wait in order for the writer."""
    from coordinator.core import events as ev

    async def go() -> None:
        crowd = CrowdServer(CoreService(parse_job(JOB)))
        fast, busy, full = _FakeWs(), _FakeWs(), _FakeWs(ok=False)
        peers = {}
        for cid, ws in (("a", fast), ("b", busy), ("c", full)):
            peers[cid] = srv._Peer(client_id=cid, ws=ws, bound=1 << 20, room=1 << 20)  # type: ignore[arg-type]
            crowd.peers[cid] = peers[cid]
        peers["b"].sending = True
        ack = m.Ack(task_id="1", accepted=True)
        frames = [m.encode(ack), b"task", b"chunk"]
        crowd._inbound = [
            ev.Send(client_id=cid, message=ack, frame=f) for f in frames for cid in "abc"
        ]
        crowd._deliver()
        assert fast.calls == [frames] and not peers["a"].queue
        assert crowd.net.frames_out == 3 and crowd.net.bytes_out == sum(map(len, frames))
        assert busy.calls == [] and [f for f, _ in peers["b"].queue] == frames
        assert peers["b"].wake.is_set()
        assert full.calls == [frames] and [f for f, _ in peers["c"].queue] == frames
        assert peers["c"].wake.is_set()

    asyncio.run(go())


def test_downloads_queue_in_their_own_room_and_the_bound_keeps_the_rest() -> None:
    """A peer whose socket takes nothing: model chunks (a download it asked for)
    queue past its bound, up to its transfer room; its own frames (acks, echoes)
    only up to the bound. Past either it is closed 4017 and its queue dropped."""
    from coordinator.core import events as ev

    chunk = m.Chunk(
        transfer="t",
        seq=0,
        total=1,
        layer=0,
        part="W",
        row_start=0,
        row_end=1,
        crc=0,
        payload=b"",
    )
    ack = m.Ack(task_id="1", accepted=True)

    def deliver(crowd: CrowdServer, message: m.Message, n: int) -> None:
        crowd._inbound = [
            ev.Send(client_id="a", message=message, frame=bytes(1000)) for _ in range(n)
        ]
        crowd._deliver()

    async def go() -> None:
        crowd = CrowdServer(CoreService(parse_job(JOB)))
        peer = srv._Peer(client_id="a", ws=_FakeWs(ok=False), bound=4000, room=10_000)  # type: ignore[arg-type]
        crowd.peers["a"] = peer
        deliver(crowd, chunk, 10)  # 10,000 bytes of download: at its room, not past
        assert peer.close is None and peer.bulk == 10_000 and peer.queued == 0
        deliver(crowd, ack, 4)  # 4,000 bytes of its own: at its bound
        assert peer.close is None and peer.queued == 4000 and len(peer.queue) == 14
        assert crowd.net.max_queued == 4000  # its own frames: downloads aside
        deliver(crowd, ack, 1)
        assert peer.close == (srv.CLOSE_SLOW_CONSUMER, "send queue full: not reading")
        assert not peer.queue and peer.queued == peer.bulk == 0

        other = srv._Peer(client_id="a", ws=_FakeWs(ok=False), bound=4000, room=10_000)  # type: ignore[arg-type]
        crowd.peers["a"] = other
        deliver(crowd, chunk, 11)  # a download past its room: not reading
        assert other.close is not None and other.close[0] == srv.CLOSE_SLOW_CONSUMER
        assert crowd.net.slow_closed == 2

    asyncio.run(go())


def test_heartbeats_reach_the_core_together_and_never_after_a_later_frame() -> None:
    """The network thread gathers heartbeats for one hand-over (the core thread wakes
    once for many); any other frame goes at once, after the heartbeats before it."""

    class Recorder:
        def __init__(self) -> None:
            self.calls: list[list[tuple[str, m.Message, int]]] = []

        def submit_receive(self, client_id: str, msg: m.Message, nbytes: int) -> None:
            self.calls.append([(client_id, msg, nbytes)])

        def submit_receives(self, received: list[tuple[str, m.Message, int]]) -> None:
            self.calls.append(list(received))

    async def go() -> None:
        crowd = CrowdServer(CoreService(parse_job(JOB)))
        rec = Recorder()
        crowd.service = rec  # type: ignore[assignment]
        beats = [m.Heartbeat(seq=i, time=1.0) for i in range(3)]
        decline = m.Decline(task_id="9", reason="busy")
        crowd._submit("a", beats[0], 10)
        crowd._submit("b", beats[1], 10)
        assert rec.calls == []  # waiting for more
        crowd._submit("a", decline, 20)
        assert rec.calls == [[("a", beats[0], 10), ("b", beats[1], 10), ("a", decline, 20)]]
        crowd._submit("b", beats[2], 10)
        assert await _until(lambda: len(rec.calls) == 2)  # the timer hands it over
        assert rec.calls[1] == [("b", beats[2], 10)]
        assert crowd._handover is None

    asyncio.run(go())
