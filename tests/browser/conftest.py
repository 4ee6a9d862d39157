"""Real Chromium (Debian's, through ``executable_path``) driven by Playwright for
Python. Nothing downloads a browser: without /usr/bin/chromium (or
``CROWDGRAD_CHROMIUM``) the browser tests skip, which CI's
``CROWDGRAD_REQUIRE_ALL=1`` turns into a failure; ``.ci/run`` installs it."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from client import WEB_ROOT

#: Flags for a machine with no network beyond loopback and no display: without
#: the background-networking ones Chromium keeps trying Google's hosts.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    # Hidden or occluded tabs would be throttled; several test tabs are all "visible".
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
]


def chromium_path() -> str | None:
    given = os.environ.get("CROWDGRAD_CHROMIUM")
    if given:
        return given
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    """One browser per test module. Not per session: Playwright's sync API runs an
    event loop in this thread while it is open, and later tests that call
    asyncio.run() (tests/e2e) would find it running."""
    path = chromium_path()
    if path is None:
        pytest.skip("no chromium on this machine (Debian: apt-get install chromium)")
    if not (WEB_ROOT / "worker.js").is_file():
        pytest.fail("client/web/static is not built: run `make web`")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture()
def context(chromium: object) -> Iterator[object]:
    """A fresh profile per test: its own Cache API, so shards are fetched anew."""
    ctx = chromium.new_context(viewport={"width": 1000, "height": 900})  # type: ignore[attr-defined]
    try:
        yield ctx
    finally:
        ctx.close()


def artifacts_dir() -> Path:
    out = Path(os.environ.get("CROWDGRAD_ARTIFACTS", "build/browser"))
    out.mkdir(parents=True, exist_ok=True)
    return out


class TcpProxy:
    """A loopback TCP proxy whose connections the test can cut: a network drop
    under a browser tab (Chromium's offline emulation leaves open websockets be)."""

    def __init__(self, target_port: int) -> None:
        import socket
        import threading

        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        #: until this time.monotonic(), new connections are dropped (the network is down)
        self.down_until = 0.0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if time.monotonic() < self.down_until:
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: object, dst: object) -> None:
        try:
            while data := src.recv(65536):  # type: ignore[attr-defined]
                dst.sendall(data)  # type: ignore[attr-defined]
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()  # type: ignore[attr-defined]

    def cut(self, down_s: float = 0.0) -> None:
        """Drop every open connection at once (RST-like: no close frame), and drop
        new ones for ``down_s`` seconds (a drop that lasts: the server sees the old
        connection go before the client's reconnect reaches it)."""
        import socket

        self.down_until = time.monotonic() + down_s
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
                s.close()

    def close(self) -> None:
        self.cut()
        self.listener.close()
