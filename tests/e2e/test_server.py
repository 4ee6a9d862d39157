"""The HTTP side, mounting into a host app, and checkpoint/restart of a real coordinator process."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import uvicorn
from fastapi import FastAPI
from websockets.asyncio.client import connect

from coordinator.http.server import CrowdServer
from coordinator.runtime.service import CoreService
from protocol import messages as m
from storage.store import CheckpointStore
from tests.e2e.e2e_helpers import ROOT, clients, digits_job, free_port, hello_frame, running


def test_status_health_docs_and_admin_token() -> None:
    with (
        running(digits_job(), admin_token="adm") as (bg, _, _),
        httpx.Client(base_url=bg.http, timeout=10) as http,
    ):
        assert http.get("/healthz").json()["ok"] is True
        status = http.get("/api/status").json()
        assert status["job"]["strategy"] == "decentral-async"
        assert {"version", "clients", "throughput", "last_evaluation"} <= set(status)
        lr = status["lr"]  # nothing diverged: no cap; the crowd's scaling alone
        assert lr["diverged_cap"] is None and lr["diverged_cuts"] == 0
        assert lr["multiplier"] >= 1.0 and lr["plateau"] == 1.0
        assert "/api/status" in http.get("/openapi.json").json()["paths"]
        assert http.get("/docs").status_code == 200
        assert http.post("/api/admin/pause").status_code == 401
        bad = {"Authorization": "Bearer nope"}
        assert http.post("/api/admin/pause", headers=bad).status_code == 401
        bare = {"Authorization": "adm"}  # a token without its scheme
        assert http.post("/api/admin/pause", headers=bare).status_code == 401
        ok = {"Authorization": "bEaReR adm"}  # RFC 7235: the scheme is case-insensitive
        assert http.post("/api/admin/pause", headers=ok).json() == {"paused": True}
        assert http.post("/api/admin/resume", headers=ok).json() == {"paused": False}
        # no store: checkpointing is refused with a reason
        r = http.post("/api/admin/checkpoint", headers=ok)
        assert r.status_code == 409 and "--store" in r.text
        # another method: 405 naming POST (issue 34: 404 from the volunteer page's
        # mount), an action that does not exist: 404
        for action in ("stop", "checkpoint", "pause", "resume"):
            r = http.get(f"/api/admin/{action}", headers=ok)
            assert r.status_code == 405 and r.headers["allow"] == "POST", action
        assert http.delete("/api/admin/stop").status_code == 405
        assert http.get("/api/admin/nope").status_code == 404
        assert http.get("/healthz").json()["ok"] is True  # nothing was stopped


def test_an_empty_admin_token_leaves_the_admin_api_off() -> None:
    """CROWDGRAD_ADMIN_TOKEN= (set, empty) is no token: nobody may pause the job."""
    with running(digits_job(), admin_token="") as (bg, _, _), httpx.Client(base_url=bg.http) as h:
        for headers in ({}, {"Authorization": "Bearer"}, {"Authorization": "Bearer x"}):
            assert h.post("/api/admin/pause", headers=headers).status_code == 403
        assert h.get("/api/status").json()["paused"] is False


def test_the_volunteer_page_is_served_at_the_root() -> None:
    """client/web/static at /: the page, its bundles and the wasm kernels with the
    type WebAssembly.instantiateStreaming needs; the API routes still win."""
    with running(digits_job()) as (bg, _, _), httpx.Client(base_url=bg.http) as http:
        page = http.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "Help train" in page.text
        for name in ("page.js", "worker.js", "style.css"):
            assert http.get(f"/{name}").status_code == 200, name
        wasm = http.get("/kernels.wasm")
        assert wasm.headers["content-type"] == "application/wasm"
        assert wasm.content[:4] == b"\0asm"
        assert http.get("/api/status").json()["version"] == 0  # no client yet
        assert http.get("/no-such-file.js").status_code == 404


def test_admin_disabled_without_token() -> None:
    with running(digits_job()) as (bg, _, _), httpx.Client(base_url=bg.http) as http:
        assert http.post("/api/admin/stop").status_code == 403


def test_mounted_under_a_host_app() -> None:
    """A game backend mounts the coordinator at /crowd; the service starts lazily."""
    service = CoreService(digits_job())
    crowd = CrowdServer(service)
    host = FastAPI()

    @host.get("/game")
    async def game() -> dict[str, str]:
        return {"game": "on"}

    host.mount("/crowd", crowd.app)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(host, ws="websockets-sansio", log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])))
    thread.start()
    try:
        while not server.started:
            time.sleep(0.01)
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/game").json() == {"game": "on"}
        assert httpx.get(f"{base}/crowd/healthz").json()["ok"] is True

        async def join() -> m.Message:
            async with connect(f"ws://127.0.0.1:{port}/crowd/ws") as ws:
                await ws.send(hello_frame("guest"))
                return m.decode(await asyncio.wait_for(ws.recv(), 10))

        assert isinstance(asyncio.run(join()), m.Welcome)
        assert httpx.get(f"{base}/crowd/api/status").json()["job"]["strategy"] == "decentral-async"
        # The volunteer page works under the mount: its paths are relative.
        page = httpx.get(f"{base}/crowd/")
        assert page.status_code == 200 and 'src="page.js"' in page.text
        assert httpx.get(f"{base}/crowd/worker.js").status_code == 200
    finally:
        server.should_exit = True
        thread.join(30)
        service.stop()
    assert service.stopped.is_set()


def _coordinator(port: int, store: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "crowdgrad", "coordinator", "--port", str(port)]
    cmd += ["--store", str(store), "--checkpoint-every", "5", "--widths", "64,64,10"]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _status(port: int, timeout: float = 60.0, until: object = None) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            st = httpx.get(f"http://127.0.0.1:{port}/api/status", timeout=5).json()
            if until is None or until(st):  # type: ignore[operator]
                return st
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "coordinator status not reached in time"
        time.sleep(0.1)


def test_sigterm_checkpoints_and_restart_carries_on(tmp_path: Path) -> None:
    store = tmp_path / "ckpt.db"
    port = free_port()
    url = f"ws://127.0.0.1:{port}/ws"
    coord = _coordinator(port, store)
    try:
        _status(port)
        with clients(url, ["a", "b"]) as procs:
            _status(port, until=lambda s: s["version"] >= 12)
            coord.send_signal(signal.SIGTERM)
            out, _ = coord.communicate(timeout=60)
            assert coord.returncode == 0, out.decode()
            with CheckpointStore.open(store, readonly=True) as cs:
                saved = cs.load_latest().version
            assert saved >= 12
            # clients were told "going away" and keep retrying; a restart carries on
            coord = _coordinator(port, store)
            st = _status(port, until=lambda s: s["version"] > saved + 5)
            assert st["checkpoints"]["restored_from"] == saved
            for p in procs.values():
                assert p.poll() is None  # still alive, reconnected
                p.send_signal(signal.SIGINT)
            assert [p.wait(30) for p in procs.values()] == [0, 0]
    finally:
        if coord.poll() is None:
            coord.send_signal(signal.SIGTERM)
            coord.wait(60)
