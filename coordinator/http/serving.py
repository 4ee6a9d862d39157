"""Serving a ``CrowdServer`` under uvicorn: in the foreground (``make_uvicorn``)
or on a thread of its own (``BackgroundServer``: tests, the demo, the Python API).

On shutdown the server drains first (final checkpoint, clients closed with 1001)
before uvicorn closes what is left, and an HTTP request still running gets
``SHUTDOWN_REQUESTS_S`` before it is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from coordinator.http.admission import http_protocol
from coordinator.http.listen import bind, join_url
from coordinator.http.server import CrowdServer
from coordinator.http.wsasgi import ReadAheadWebSocketProtocol

log = logging.getLogger(__name__)

#: Seconds HTTP requests still running after the drain get before they are cancelled.
SHUTDOWN_REQUESTS_S = 3.0


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
