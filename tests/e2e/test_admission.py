"""Connections that cost a file descriptor and nothing else are bounded: a handshake
deadline, open connections per address, websocket sessions per address per second
(coordinator/admission.py)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from coordinator.admission import AdmissionLimits
from tests.e2e.e2e_helpers import digits_job, hello_frame, running


def _port(url: str) -> int:
    return int(url.split(":")[2].split("/")[0])


def _closed(sock: socket.socket, within: float) -> bool:
    """Whether the server closes or resets ``sock`` within ``within`` seconds."""
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_connections_that_never_send_a_byte_are_closed_at_the_deadline() -> None:
    limits = AdmissionLimits(handshake_timeout_s=0.5)
    with running(digits_job(), admission=limits) as (bg, _, _):
        socks = [socket.create_connection(("127.0.0.1", _port(bg.url))) for _ in range(50)]
        half = socket.create_connection(("127.0.0.1", _port(bg.url)))
        half.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\n")  # half a request, then nothing
        try:
            assert all(_closed(s, 10.0) for s in [*socks, half])
            assert bg.crowd.admission.timed_out == 51
            assert not bg.crowd.admission.open  # every count given back
        finally:
            for s in [*socks, half]:
                s.close()


def test_an_address_over_its_bound_is_refused_and_counts_come_back() -> None:
    limits = AdmissionLimits(max_connections_per_ip=5, handshake_timeout_s=30.0)
    with running(digits_job(), admission=limits) as (bg, _, _):
        held = [socket.create_connection(("127.0.0.1", _port(bg.url))) for _ in range(5)]
        extra = socket.create_connection(("127.0.0.1", _port(bg.url)))
        assert _closed(extra, 10.0)
        assert not _closed(held[0], 0.2)
        assert bg.crowd.admission.refused_open == 1
        for s in [*held, extra]:
            s.close()

        async def five_sessions() -> None:
            for _ in range(2):  # twice five: websocket connections give their count back
                async with contextlib.AsyncExitStack() as stack:
                    for _ in range(5):
                        ws = await stack.enter_async_context(connect(bg.url))
                        await ws.send(hello_frame())
                deadline = time.monotonic() + 10
                while bg.crowd.admission.open and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert not bg.crowd.admission.open

        asyncio.run(five_sessions())


def test_sessions_opened_too_fast_from_one_address_are_closed_1008() -> None:
    limits = AdmissionLimits(hellos_per_ip_per_s=0.5, hello_burst=2)
    with running(digits_job(), admission=limits) as (bg, _, _):

        async def three() -> int | None:
            codes = []
            for _ in range(3):
                async with connect(bg.url) as ws:
                    with contextlib.suppress(ConnectionClosed, TimeoutError):
                        await ws.send(hello_frame())
                        await asyncio.wait_for(ws.recv(), 5)
                    codes.append(ws.close_code)
            return codes[-1]

        assert asyncio.run(three()) == 1008
        assert bg.crowd.admission.refused_rate == 1


@pytest.mark.parametrize(
    "kw", [{"handshake_timeout_s": 0}, {"max_connections_per_ip": 0}, {"hello_burst": 0.5}]
)
def test_bad_limits_name_the_field(kw) -> None:
    with pytest.raises(ValueError, match=next(iter(kw)).split("_")[0]):
        AdmissionLimits(**kw)
