"""Real servers on 127.0.0.1 ephemeral ports, real client subprocesses, raw websocket peers."""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from coordinator.core import events as ev
from coordinator.core.config import JobConfig, parse_job
from coordinator.http.server import CrowdServer
from coordinator.http.serving import BackgroundServer
from coordinator.runtime.service import CoreService
from protocol import messages as m

ROOT = Path(__file__).resolve().parents[2]

#: How long a test waits for an event (a job's end, a client's exit) before it
#: calls the run hung. A hang guard, never the claim: jobs here end by their own
#: counts (target accuracy, max_versions), not by wall time, because CI runs four
#: numba clients on two busy cores and a slow run is still a correct one.
HANG_GUARD_S = 900.0

#: Per strategy: hyperparameters that reach 0.95 on digits in well under a minute.
SETTINGS: dict[str, tuple[dict[str, Any], int]] = {
    "decentral-async": ({"tau": 10, "lr": 0.1}, 16),
    "decentral-sync": ({"tau": 10, "lr": 0.1, "clients_per_round": 4}, 16),
    "central-async": ({"lr": 0.2}, 64),
    "central-sync": ({"lr": 0.3, "clients_per_round": 4}, 64),
}


def digits_job(name: str = "decentral-async", /, **sections: dict[str, Any]) -> JobConfig:
    params, batch = SETTINGS[name]
    base: dict[str, Any] = {
        "model": {"widths": [64, 64, 10]},
        "data": {"shards": 8, "batch": batch},
        "strategy": {"name": name, **params},
        "eval": {"every_versions": 5},
        # no max_time_s: a job ends at its target or after max_versions (see HANG_GUARD_S)
        "stop": {"target_accuracy": 0.95, "max_versions": 2000},
    }
    for key, fields in sections.items():
        base[key] = {**base.get(key, {}), **fields}
    return parse_job(base)


class Recorder:
    """Collects every core output (on the core thread) for assertions."""

    def __init__(self) -> None:
        self.outputs: list[ev.Output] = []
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)

    def __call__(self, outputs: list[ev.Output]) -> None:
        with self._lock:
            self.outputs.extend(outputs)
            self.changed.notify_all()

    def of(self, kind: type) -> list[Any]:
        with self._lock:
            return [o for o in self.outputs if isinstance(o, kind)]

    def wait_for(self, pred: Callable[[], bool], timeout: float = 60.0) -> bool:
        """Poll ``pred`` each time outputs arrive (at least every 0.2 s) until true."""
        deadline = time.monotonic() + timeout
        while not pred():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with self._lock:
                self.changed.wait(min(left, 0.2))
        return True


@contextlib.contextmanager
def running(
    job: JobConfig, **server_kw: Any
) -> Iterator[tuple[BackgroundServer, CoreService, Recorder]]:
    store = server_kw.pop("store", None)
    service = CoreService(job, store=store)
    rec = Recorder()
    service.add_sink(rec)
    crowd = CrowdServer(service, **server_kw)
    with BackgroundServer(crowd) as bg:
        yield bg, service, rec


def spawn_client(url: str, name: str, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "crowdgrad", "client", url, "--name", name, "--flops", "1e9"]
    return subprocess.Popen(
        [*cmd, *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


@contextlib.contextmanager
def clients(url: str, names: list[str], *extra: str) -> Iterator[dict[str, subprocess.Popen]]:
    procs = {n: spawn_client(url, n, *extra) for n in names}
    try:
        yield procs
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait(10)
            if p.stderr is not None:
                p.stderr.close()


def train_together(
    url: str, service: CoreService, rec: Recorder, names: list[str]
) -> dict[str, int | None]:
    """Start client processes ``names``, take results only once each has sent its
    first (one that starts late on a loaded machine would otherwise find the job
    done: a round takes milliseconds), wait for the job's end; their exit codes."""
    service.set_paused(True)
    with clients(url, names) as procs:
        assert rec.wait_for(lambda: len(rec.of(ev.ClientJoined)) == len(names))
        deadline = time.monotonic() + HANG_GUARD_S
        while len(service.stats.held_results) < len(names):
            assert time.monotonic() < deadline, "a client never sent a result"
            time.sleep(0.05)
        service.set_paused(False)
        assert service.done.wait(HANG_GUARD_S), service.stats
        return {n: p.wait(30) for n, p in procs.items()}


def play_frames(client: Any, seconds: float) -> None:
    """Drive an in-game ``client`` like a 60 Hz game, 4 ms a frame, until it
    finishes (or ``seconds`` pass), then a few more frames for the close."""
    deadline = time.monotonic() + seconds
    while client.finished is None and time.monotonic() < deadline:
        client.step(0.004)
        time.sleep(1 / 60)
    for _ in range(30):  # the closing handshake finishes on later frames
        client.step(0.004)


def free_port() -> int:
    """A port nothing listens on now (for a server started later on it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def hello_frame(name: str = "raw", **kw: Any) -> bytes:
    return m.encode(m.Hello(client=name, **kw))


def upgrade_by_hand(s: socket.socket, port: int) -> bytes:
    """Upgrade the connected socket ``s`` to a websocket on ``/ws`` with raw bytes (no
    client library: nothing copied, no client-side objects); asserts the 101 and
    returns what the server sent after its response head."""
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(
        (
            f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    buf = b""
    while b"\r\n\r\n" not in buf:
        got = s.recv(4096)
        assert got, "closed during the handshake"
        buf += got
    head, rest = buf.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 101"), head[:80]
    return rest
