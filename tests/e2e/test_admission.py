"""Connections that cost a file descriptor and nothing else are bounded: a handshake
deadline, open connections per address, websocket sessions per address per second
(coordinator/http/admission.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import urllib.request

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from coordinator.http.admission import AdmissionLimits
from protocol import messages as m
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


def _status(bg) -> dict:
    """GET /api/status on a connection of its own."""
    with urllib.request.urlopen(f"{bg.http}/api/status", timeout=30) as r:
        assert r.status == 200
        return json.loads(r.read())


def _wait_counts_back(bg) -> None:
    deadline = time.monotonic() + 10
    adm = bg.crowd.admission
    while (adm.open or adm.sockets) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not adm.open and not adm.sockets  # every count given back


def test_an_address_over_its_bound_is_refused_and_counts_come_back() -> None:
    """TCP connections beyond the websocket bound plus the spare are reset at accept;
    the ones under it are served."""
    limits = AdmissionLimits(
        max_connections_per_ip=3, http_spare_per_ip=2, handshake_timeout_s=30.0
    )
    with running(digits_job(), admission=limits) as (bg, _, _):
        held = [socket.create_connection(("127.0.0.1", _port(bg.url))) for _ in range(5)]
        extra = socket.create_connection(("127.0.0.1", _port(bg.url)))
        assert _closed(extra, 10.0)
        assert bg.crowd.admission.refused_open == 1
        held[0].sendall(b"GET /api/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        held[0].settimeout(30)
        assert held[0].recv(64).startswith(b"HTTP/1.1 200")
        for s in [*held, extra]:
            s.close()
        _wait_counts_back(bg)

        async def three_sessions() -> None:
            for _ in range(2):  # twice three: websocket connections give their count back
                async with contextlib.AsyncExitStack() as stack:
                    for _ in range(3):
                        ws = await stack.enter_async_context(connect(bg.url))
                        await ws.send(hello_frame())
                await asyncio.to_thread(_wait_counts_back, bg)

        asyncio.run(three_sessions())


def test_an_address_at_its_websocket_bound_still_gets_its_status() -> None:
    """Issue 34 #11: the operator's own GET /api/status from an address at its bound
    was reset with everything else. Now the spare connections carry plain HTTP, a
    websocket upgrade on one is answered 429, and beyond the spare it is reset."""
    limits = AdmissionLimits(
        max_connections_per_ip=3, http_spare_per_ip=2, handshake_timeout_s=30.0
    )
    with running(digits_job(), admission=limits) as (bg, _, _):

        async def at_the_bound() -> None:
            async with contextlib.AsyncExitStack() as stack:
                held = []
                for _ in range(3):
                    ws = await stack.enter_async_context(connect(bg.url))
                    await ws.send(hello_frame())
                    assert isinstance(m.decode(await asyncio.wait_for(ws.recv(), 30)), m.Welcome)
                    held.append(ws)
                # a fourth websocket: refused at the upgrade, 429
                with pytest.raises(InvalidStatus) as refused:
                    async with connect(bg.url, open_timeout=30):
                        pass
                assert refused.value.response.status_code == 429
                # plain HTTP still answers, on both spare connections at once
                a, _ = await asyncio.gather(
                    asyncio.to_thread(_status, bg), asyncio.to_thread(_status, bg)
                )
                assert a["network"]["admission"]["over_per_address_bound"] == 1
                # the spare is bounded: with both spare connections held, the next is reset
                spare = [
                    await asyncio.to_thread(socket.create_connection, ("127.0.0.1", bg.port))
                    for _ in range(2)
                ]
                extra = await asyncio.to_thread(socket.create_connection, ("127.0.0.1", bg.port))
                try:
                    assert await asyncio.to_thread(_closed, extra, 10.0)
                    assert bg.crowd.admission.refused_open == 2
                finally:
                    for s in [*spare, extra]:
                        s.close()
                # the websockets held all along are untouched: a heartbeat is echoed
                await held[0].send(m.encode(m.Heartbeat(seq=1, time=7.0)))
                while True:
                    msg = m.decode(await asyncio.wait_for(held[0].recv(), 30))
                    if isinstance(msg, m.Heartbeat) and msg.echo == 7.0:
                        break
            await asyncio.to_thread(_wait_counts_back, bg)

        asyncio.run(at_the_bound())


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
    "kw",
    [
        {"handshake_timeout_s": 0},
        {"max_connections_per_ip": 0},
        {"http_spare_per_ip": -1},
        {"hello_burst": 0.5},
    ],
)
def test_bad_limits_name_the_field(kw) -> None:
    with pytest.raises(ValueError, match=next(iter(kw)).split("_")[0]):
        AdmissionLimits(**kw)
