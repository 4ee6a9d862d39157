"""Hostile peers over a real socket: each gets its documented error and close code,
and two well-behaved client subprocesses keep training meanwhile (asserted per case).

Codes: docs/protocol.md §7 and protocol/errors.py; 4017 is the server's slow-consumer close.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from coordinator.http import wsasgi as server_mod
from coordinator.http.serving import BackgroundServer
from coordinator.runtime.service import CoreService
from nn.params import Params
from nn.spec import ModelSpec
from protocol import messages as m
from protocol.chunking import chunk_params
from protocol.errors import ErrorCode
from tests.e2e.e2e_helpers import clients, digits_job, hello_frame, running

TOKEN = "s3cret"
MAX_MESSAGE = 64 * 1024
RATE = 100


@pytest.fixture(scope="module")
def trained() -> Iterator[tuple[BackgroundServer, CoreService]]:
    job = digits_job(
        "decentral-async",
        stop={
            "target_accuracy": None,
            "max_versions": 1_000_000,
            "max_time_s": None,
            "patience": 0,
        },
        eval={"every_versions": 100},
        link={"profile": "lan", "messages_per_s": RATE, "max_message_bytes": MAX_MESSAGE},
    )
    with (
        running(job, join_token=TOKEN) as (bg, service, _),
        clients(bg.url, ["good0", "good1"], "--token", TOKEN) as procs,
    ):
        assert _progress(service, 10, timeout=60)
        yield bg, service
        assert all(p.poll() is None for p in procs.values())  # nobody fell over


def _progress(service: CoreService, n: int, timeout: float = 30.0) -> bool:
    """The good clients move the model ``n`` versions within ``timeout``."""
    start = service.stats.version
    return service.done.wait(0) is False and _wait(
        lambda: service.stats.version >= start + n, timeout
    )


def _wait(pred: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


async def _raw(
    url: str, frames: list[bytes | str], *, hello: bytes | None = None
) -> tuple[int | None, list[m.Message]]:
    """Send ``hello`` (default: a valid one), wait for welcome, send ``frames``, read to
    the close; returns the close code received and the messages decoded."""
    got: list[m.Message] = []
    async with connect(url, max_size=None, compression=None) as ws:
        await ws.send(hello if hello is not None else hello_frame(token=TOKEN))
        try:
            while hello is None and not any(isinstance(x, m.Welcome) for x in got):
                got.append(m.decode(await asyncio.wait_for(ws.recv(), 10)))
            for f in frames:
                await ws.send(f)
            while True:
                got.append(m.decode(await asyncio.wait_for(ws.recv(), 10)))
        except ConnectionClosed as exc:
            return (exc.rcvd.code if exc.rcvd else None), got
    return None, got


def _errors(got: list[m.Message]) -> list[int]:
    return [x.code for x in got if isinstance(x, m.Error)]


def _check(bg: BackgroundServer, service: CoreService, frames: list, **kw: Any) -> tuple:
    code, got = asyncio.run(_raw(bg.url, frames, **kw))
    assert _progress(service, 3), "the good clients stopped making progress"
    return code, _errors(got)


def test_random_bytes(trained: tuple) -> None:
    junk = np.random.default_rng(7).integers(0, 256, 512, dtype=np.uint8).tobytes()
    junk = b"\xc1" + junk  # 0xc1 is never valid msgpack
    assert _check(*trained, [junk]) == (1007, [ErrorCode.MALFORMED])


def test_truncated_frame(trained: tuple) -> None:
    frame = m.encode(m.Heartbeat(seq=1, time=1.0))
    assert _check(*trained, [frame[:-3]]) == (1007, [ErrorCode.MALFORMED])


def test_unknown_type(trained: tuple) -> None:
    frame = msgpack.packb({"type": "teleport", "where": "moon"})
    assert _check(*trained, [frame]) == (4002, [ErrorCode.UNKNOWN_TYPE])


def test_text_frame(trained: tuple) -> None:
    assert _check(*trained, ["hello"]) == (1003, [ErrorCode.MALFORMED])


def test_frame_over_message_limit(trained: tuple) -> None:
    frame = msgpack.packb({"type": "bye", "reason": "x", "pad": b"\0" * (MAX_MESSAGE + 10)})
    assert _check(*trained, [frame]) == (1009, [ErrorCode.TOO_LARGE])


def test_frame_over_websocket_limit(trained: tuple) -> None:
    # refused by the websocket layer (uvicorn ws_max_size) before anything decodes it
    code, errors = _check(*trained, [b"\0" * (4 * MAX_MESSAGE + 64 * 1024)])
    assert code == 1009 and errors == []


def test_result_for_task_never_leased(trained: tuple) -> None:
    spec = ModelSpec(widths=(64, 64, 10))
    delta = Params.from_flat(spec, np.zeros(spec.num_params, np.float32))
    chunks = chunk_params(delta, max_message_bytes=32 * 1024, transfer="999999")
    result = m.Result(
        task_id="999999", model_version=0, kind="train", num_chunks=len(chunks), steps=1
    )
    frames = [m.encode(x) for x in [result, *chunks]] + [m.encode(m.Bye(reason="done"))]
    code, got = asyncio.run(_raw(trained[0].url, frames))
    acks = [(a.task_id, a.accepted, a.reason) for a in got if isinstance(a, m.Ack)]
    assert acks == [("999999", False, "unknown_task")]
    assert code == 1000  # refused, not closed: it is an honest race in real clients
    assert _progress(trained[1], 3)


def test_chunk_without_result(trained: tuple) -> None:
    spec = ModelSpec(widths=(64, 64, 10))
    delta = Params.from_flat(spec, np.zeros(spec.num_params, np.float32))
    chunk = chunk_params(delta, max_message_bytes=32 * 1024, transfer="424242")[0]
    assert _check(*trained, [m.encode(chunk)]) == (4008, [ErrorCode.UNKNOWN_TASK])


def test_flood_above_message_rate(trained: tuple) -> None:
    frames = [m.encode(m.Heartbeat(seq=i, time=0.0)) for i in range(20 * RATE)]
    assert _check(*trained, frames) == (1008, [ErrorCode.RATE_LIMITED])


def test_wrong_join_token(trained: tuple) -> None:
    code, errors = _check(*trained, [], hello=hello_frame(token="guess"))
    assert (code, errors) == (4007, [ErrorCode.AUTH_FAILED])


def test_first_frame_not_hello(trained: tuple) -> None:
    frame = m.encode(m.Heartbeat(seq=1, time=0.0))
    assert _check(*trained, [], hello=frame) == (4013, [ErrorCode.UNEXPECTED])


def test_client_that_never_reads_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer that sends heartbeats but never reads: the echoes pile up in its send
    queue, which is bounded; it is closed with 4017 and memory stays bounded. The
    close does not wait behind its full socket buffer: the connection is reset once
    the close handshake has had ``CLOSE_ABORT_S``, and no heartbeat sent after the
    close reaches the core."""
    monkeypatch.setattr(server_mod, "CLOSE_ABORT_S", 0.5)
    # a 9 MB model: the first download alone fills the socket buffers
    job = digits_job(
        "decentral-async",
        model={"widths": [64, 2048, 1024, 10]},
        stop={"target_accuracy": None, "max_versions": 10, "max_time_s": None},
    )
    bound = 16 * 1024
    with running(job, send_queue_bytes=bound) as (bg, _, _):
        rss0 = current_rss_mb()

        async def never_read() -> int:
            """Heartbeats after the close until the connection dies; how many got out."""
            async with connect(bg.url, max_size=None, compression=None, max_queue=1) as ws:
                await ws.send(hello_frame())
                for i in range(20_000):
                    if bg.crowd.net.slow_closed:
                        at_close.append(bg.crowd.net.frames_in)
                        break
                    await ws.send(m.encode(m.Heartbeat(seq=i, time=0.0)))
                    if i % 50 == 0:
                        await asyncio.sleep(0.005)
                after = 0
                with contextlib.suppress(ConnectionClosed, OSError):
                    for after in range(1, 2_000):  # 20 s at most: the reset comes in 0.5 s
                        await ws.send(m.encode(m.Heartbeat(seq=after, time=0.0)))
                        await asyncio.sleep(0.01)
                    return -1  # never reset
                return after

        at_close: list[int] = []
        after = asyncio.run(never_read())
        assert bg.crowd.net.slow_closed == 1
        assert after > 0, "the connection of a slow consumer was never torn down"
        assert bg.crowd.net.frames_in <= at_close[0] + 1  # nothing after the close counted
        assert _wait(lambda: not bg.crowd.peers, 10)
        # the queue never held more than its bound plus one frame
        assert bg.crowd.net.max_queued <= bound + 1024
        # Now, not the lifetime peak (ru_maxrss), which earlier tests may have set.
        grown_mb = current_rss_mb() - rss0
        assert grown_mb < 200, f"memory grew {grown_mb:.0f} MB"


def current_rss_mb() -> float:
    """This process's resident memory now (Linux /proc), in MB."""
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_a_peer_that_reads_nothing_at_all_is_reset_after_its_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A raw TCP peer that stops reading after the handshake: the 9 MB model frame
    fills the server's socket buffer, heartbeat echoes then fill the send queue and
    the peer is closed (4017) while the transport is paused. The close frame sits
    behind the full buffer, so a graceful close never ends; the connection must be
    reset once it had CLOSE_ABORT_S, not stay open (it stayed established, taking
    heartbeats, for over a minute before the fix)."""
    import socket

    from websockets.client import ClientProtocol
    from websockets.uri import parse_uri

    monkeypatch.setattr(server_mod, "CLOSE_ABORT_S", 0.5)
    job = digits_job(
        "decentral-async",
        model={"widths": [64, 2048, 1024, 10]},
        stop={"target_accuracy": None, "max_versions": 10, "max_time_s": None},
    )
    # The model frame (9 MB) queues in the room for downloads; the bound is for
    # the connection's own frames, here the echoes.
    with running(job, send_queue_bytes=200_000) as (bg, _, _):
        proto = ClientProtocol(parse_uri(bg.url))
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", int(bg.url.split(":")[2].split("/")[0])))
        proto.send_request(proto.connect())
        sock.sendall(b"".join(proto.data_to_send()))
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1)
        assert head.startswith(b"HTTP/1.1 101")
        proto.receive_data(head)
        proto.events_received()
        proto.send_binary(hello_frame())
        sock.sendall(b"".join(proto.data_to_send()))
        sock.settimeout(0.2)
        reset = False
        deadline = time.monotonic() + 20.0
        seq = 0
        while time.monotonic() < deadline:  # heartbeats, never a read
            for _ in range(200):
                seq += 1
                proto.send_binary(m.encode(m.Heartbeat(seq=seq, time=0.0)))
            try:
                sock.sendall(b"".join(proto.data_to_send()))
            except TimeoutError:
                pass  # our send buffer is full: the server stopped reading, still open
            except (ConnectionResetError, BrokenPipeError):
                reset = True
                break

            time.sleep(0.02)
        sock.close()
        assert bg.crowd.net.slow_closed == 1
        assert reset, "the slow consumer's connection was still open 20 s after its close"
