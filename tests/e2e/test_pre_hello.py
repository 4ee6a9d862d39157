"""Memory before login (issue 34 #4): until a connection's hello is taken its frames
are capped at ``PRE_HELLO_MAX_BYTES``, refused from the header with close 1009
(docs/protocol.md §2); once the hello is taken the link's maximum applies again.
Real uvicorn on loopback, real websockets and raw sockets, a real client process."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from concurrent.futures import ThreadPoolExecutor

import msgpack
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from coordinator.http import wsasgi
from coordinator.http.wsasgi import PRE_HELLO_MAX_BYTES
from protocol import messages as m
from protocol.errors import ErrorCode
from tests.e2e.e2e_helpers import (
    digits_job,
    hello_frame,
    running,
    train_together,
    upgrade_by_hand,
)
from tests.e2e.test_bad_input import current_rss_mb

#: hang guard for one socket operation, never the claim
SOCKET_TIMEOUT_S = 120.0


async def _first_frame(url: str, frame: bytes | list[bytes]) -> tuple[int | None, list[int]]:
    """Open a websocket, send ``frame`` (a list: the fragments of one message) as the
    first message, read to the close: the close code and the error codes received."""
    errors: list[int] = []
    async with connect(url, max_size=None, compression=None) as ws:
        try:
            await ws.send(frame)
            while True:
                msg = m.decode(await asyncio.wait_for(ws.recv(), 30))
                if isinstance(msg, m.Error):
                    errors.append(msg.code)
        except ConnectionClosed as exc:
            return (exc.rcvd.code if exc.rcvd else None), errors
    return None, errors


def test_over_the_cap_before_hello_is_closed_1009_and_an_honest_client_trains_after() -> None:
    job = digits_job(stop={"target_accuracy": None, "max_versions": 20, "max_time_s": None})
    with running(job) as (bg, service, rec):
        assert bg.crowd.ws_max_size > 4 * PRE_HELLO_MAX_BYTES  # the lan link: 64 MiB

        # At the cap it reaches the decoder (zeros are not a msgpack map)...
        at_cap = asyncio.run(_first_frame(bg.url, b"\0" * PRE_HELLO_MAX_BYTES))
        assert at_cap == (1007, [ErrorCode.MALFORMED])
        # ...one byte over, the websocket layer refuses it: 1009, no error frame.
        over = asyncio.run(_first_frame(bg.url, b"\0" * (PRE_HELLO_MAX_BYTES + 1)))
        assert over == (1009, [])
        # The cap is per message: fragments that add up past it are refused too.
        half = b"\0" * (PRE_HELLO_MAX_BYTES // 2)
        assert asyncio.run(_first_frame(bg.url, [half, half, b"\0"])) == (1009, [])
        # A padded hello is no hello.
        padded = msgpack.packb(
            {"type": "hello", "client": "big", "pad": b"\0" * PRE_HELLO_MAX_BYTES},
            use_bin_type=True,
        )
        assert asyncio.run(_first_frame(bg.url, padded)) == (1009, [])

        codes = train_together(bg.url, service, rec, ["honest"])
        assert codes == {"honest": 0}
        assert service.stats.version >= 20


def test_the_cap_lifts_once_the_hello_is_taken() -> None:
    """Frames over the pre-hello cap but under the link's maximum, the first sent
    right after welcome, are taken."""
    job = digits_job(
        stop={"target_accuracy": None, "max_versions": 1_000_000, "max_time_s": None, "patience": 0}
    )
    with running(job) as (bg, _, _):

        async def go() -> list[float | None]:
            echoes: list[float | None] = []
            async with connect(bg.url, max_size=None, compression=None) as ws:
                await ws.send(hello_frame())
                while not isinstance(m.decode(await asyncio.wait_for(ws.recv(), 30)), m.Welcome):
                    pass
                for i, size in enumerate([4 * PRE_HELLO_MAX_BYTES, 64 * PRE_HELLO_MAX_BYTES]):
                    # unknown keys are ignored (docs/protocol.md §9): a 256 KiB, then a
                    # 4 MiB heartbeat
                    beat = {"type": "heartbeat", "seq": i, "time": 100.0 + i, "pad": b"\0" * size}
                    await ws.send(msgpack.packb(beat, use_bin_type=True))
                    while True:
                        msg = m.decode(await asyncio.wait_for(ws.recv(), 30))
                        if isinstance(msg, m.Heartbeat) and msg.echo is not None:
                            echoes.append(msg.echo)
                            break
                        assert not isinstance(msg, m.Error), msg
            return echoes

        assert asyncio.run(go()) == [100.0, 101.0]
        assert bg.crowd.net.refused == 0


def _stranger(port: int, length: int, payload: memoryview) -> int | None:
    """By hand, so nothing is copied: upgrade to a websocket, send the header of a
    ``length``-byte binary frame (masked with a zero key: the payload goes as is),
    then ``payload``; return the close code the server sends."""
    with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_S) as s:
        buf = upgrade_by_hand(s, port)
        s.sendall(bytes([0x82, 0x80 | 127]) + struct.pack("!Q", length) + b"\0\0\0\0")
        s.sendall(payload)
        while len(buf) < 4:  # a close frame: 0x88, length < 126, code, reason
            got = s.recv(4096)
            if not got:
                return None
            buf += got
        assert buf[0] == 0x88, buf[:8]
        return int(struct.unpack("!H", buf[2:4])[0])


def test_strangers_sending_maximal_frames_before_hello_cost_no_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """50 connections, each one maximal frame (8 MiB here) before any hello, all at
    once: 400 MiB offered. Buffered, as before the cap, the process grew by about
    that; refused from the header, it grows by a few MB (generous bound: 64 MB)."""
    # The server reads and discards until the peer closes, so every stranger sends
    # its whole frame and reads its close code.
    monkeypatch.setattr(wsasgi, "CLOSE_LINGER_S", SOCKET_TIMEOUT_S)
    job = digits_job(link={"max_message_bytes": 8 * 1024 * 1024})
    with running(job) as (bg, _, _):
        length = bg.crowd.ws_max_size
        payload = memoryview(bytes(length))
        port = bg.port
        assert [_stranger(port, length, payload[:1024]) for _ in range(3)] == [1009] * 3
        base = current_rss_mb()
        peak = [base]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], current_rss_mb())
                done.wait(0.002)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            with ThreadPoolExecutor(max_workers=50) as pool:
                codes = list(pool.map(lambda _: _stranger(port, length, payload), range(50)))
        finally:
            done.set()
            sampler.join(10)
        assert codes == [1009] * 50
        grown = peak[0] - base
        assert grown < 64, f"50 maximal pre-hello frames grew the process by {grown:.0f} MB"


def test_the_largest_valid_hello_fits_the_pre_hello_cap() -> None:
    """The cap is only for strangers' junk: every field of a ``hello`` is bounded, and
    at its longest (4-byte UTF-8 characters in every string, every list full: 9 KiB)
    it fits ``PRE_HELLO_MAX_BYTES`` with room to spare."""
    wide = "\U0001f600"  # 4 bytes in UTF-8
    hello = m.Hello(
        client=wide * 64, platform=wide * 64, cores=4096, memory=2**63 - 1, flops=1e18,
        limits=m.LinkLimits(bytes_per_s=1e18, messages_per_s=1e18,
                            max_message_bytes=2**62, burst=1e6),
        codecs=tuple(wide * 32 for _ in range(32)), token=wide * 512, resume=wide * 128,
        deltas=True, seeded_init=True, spans=True, data=True,
        init_schemes=tuple(wide * 32 for _ in range(8)), boundary=True, volunteer=wide * 128,
    )  # fmt: skip
    frame = m.encode(hello)
    assert isinstance(m.decode(frame), m.Hello)  # valid, every field checked
    assert 1.5 * len(frame) <= PRE_HELLO_MAX_BYTES, len(frame)
