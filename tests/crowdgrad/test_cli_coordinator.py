"""``crowdgrad coordinator``'s console: where to look, and a restart that says so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from coordinator.runtime.service import CoreService
from tests.coordinator.coord_helpers import digits, make_job

ROOT = Path(__file__).resolve().parents[2]


def _banner(store: Path) -> str:
    """Start the coordinator CLI, read its banner up to the store line, stop it."""
    cmd = [sys.executable, "-m", "crowdgrad", "coordinator", "--port", "0", "--store", str(store)]
    cmd += ["--widths", "64,16,10"]
    env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    deadline = time.monotonic() + 120
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.strip().startswith("store:") or time.monotonic() > deadline:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return "".join(lines)


def test_a_restart_says_resumed_from_checkpoint_n(tmp_path: Path) -> None:
    store = tmp_path / "run.db"
    out = _banner(store)
    assert "store:      " in out and "no checkpoint yet, starting from model v0" in out
    for page in ("/dashboard", "/metrics", "/api/status"):
        assert page in out
    service = CoreService(make_job(), store=store, dataset=digits())
    service.start()
    service.checkpoint_now().result(30)
    service.stop()
    out = _banner(store)
    assert "resumed from checkpoint" in out and "Traceback" not in out


def test_console_lines_never_block_the_core_thread() -> None:
    import io
    import threading

    from rich.console import Console

    from crowdgrad.commands.coordinator import ConsolePrinter

    gate = threading.Event()

    class Stuck(io.StringIO):
        def write(self, s: str) -> int:
            gate.wait(10)  # a pipe nobody reads
            return super().write(s)

    out = Stuck()
    say = ConsolePrinter(Console(file=out, width=200), stamp=lambda: "t", queue_lines=3)
    t0 = time.monotonic()
    for i in range(50):
        say(f"line {i}")
    assert time.monotonic() - t0 < 1.0 and say.dropped > 40
    gate.set()
    say.flush()  # the backlog drains; the next line says how many were dropped
    say("after")
    say.flush()
    text = out.getvalue()
    assert "t  line 0" in text and "console lines dropped: the output was blocked" in text
    assert text.rstrip().endswith("t  after")
