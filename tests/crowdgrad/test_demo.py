"""``crowdgrad demo`` as a newcomer meets it: phases, URLs, a timeline, a summary."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from crowdgrad.cli import main
from crowdgrad.commands.demo import accuracy_text, process_age

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_says_what_it_does_and_where_to_look(tmp_path) -> None:
    """Without a terminal (CI, a pipe) it ends after the summary, exit 0."""
    env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    argv = ["demo", "--clients", "2", "--target", "0.8", "--store", "demo.db"]
    res = subprocess.run(
        [sys.executable, "-m", "crowdgrad", *argv], stdin=subprocess.DEVNULL,
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    out = res.stdout
    assert res.returncode == 0, out + res.stderr
    assert "Press Ctrl-C" not in out and "keeps serving" not in out
    assert "Traceback" not in out + res.stderr
    for phrase in ("[1/3] Serving at ws://127.0.0.1:", "[2/3] Starting 2 client processes",
                   "[3/3] Meanwhile, preparing the coordinator", "coordinator ready",
                   "first result accepted, from demo", "job finished (target_accuracy)",
                   "Summary", "reached test accuracy", "Next", "docs/formats.md"):  # fmt: skip
        assert phrase in out, phrase
    assert re.search(r"dashboard: +http://127\.0\.0\.1:\d+/dashboard", out)
    assert re.search(r"volunteers: +http://127\.0\.0\.1:\d+/ ", out)
    first = re.search(r"first accepted result at ([0-9.]+) s", out)
    assert first is not None and 0 < float(first.group(1)) < 120
    assert "accuracy 0.000" not in out
    assert "the trained model is checkpoint v" in out and " in demo.db: crowdgrad checkpoint" in out
    onnx = tmp_path / "model.onnx"
    assert (
        main(["checkpoint", "export", "--store", str(tmp_path / "demo.db"), "--out", str(onnx)])
        == 0
    )
    assert onnx.stat().st_size > 30_000


def test_no_evaluation_is_not_zero_accuracy() -> None:
    assert accuracy_text(None) == "no evaluation yet"
    assert accuracy_text({"accuracy": 0.91234, "version": 40, "loss": 0.3}) == "0.912 (v40)"
    assert 0.0 <= process_age() < 3600


def test_no_clients_is_a_usage_error(capsys, tmp_path) -> None:
    assert main(["demo", "--clients", "0"]) == 2
    assert "--clients must be >= 1" in capsys.readouterr().err
    (tmp_path / "old.db").write_bytes(b"")
    assert main(["demo", "--store", str(tmp_path / "old.db")]) == 2
    assert "old.db exists; the demo starts from scratch" in capsys.readouterr().err
    assert main(["demo", "--store", str(tmp_path / "nope" / "d.db")]) == 2
    assert "nope does not exist; create it first" in capsys.readouterr().err


def _inherit_ignored_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_on_a_terminal_the_demo_keeps_serving_the_finished_run_until_ctrl_c(
    tmp_path, sigint: str
) -> None:
    """Issue 36: stdin and stdout a terminal (a pty here): after the summary the
    coordinator serves on, training stopped, and the dashboard, the volunteer page
    and the run's status and history still answer; SIGINT (Ctrl-C) ends it, exit 0.
    Also when it started with SIGINT ignored, as a shell without job control starts
    a background command (Python then keeps it ignored): the 60-s hang of a CI run
    launched from such a shell."""
    env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    env["PYTHONFAULTHANDLER"] = "1"
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "crowdgrad", "demo", "--clients", "2", "--target", "0.8"],
        stdin=slave, stdout=slave, stderr=slave, env=env, cwd=tmp_path, start_new_session=True,
        preexec_fn=_inherit_ignored_sigint if sigint == "ignored" else None,
    )  # fmt: skip
    os.close(slave)
    chunks: list[bytes] = []
    waiting = threading.Event()  # it says it keeps serving

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                return
            if not data:
                return
            chunks.append(data)
            if b"Press Ctrl-C to stop." in b"".join(chunks):
                waiting.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def output() -> str:
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))

    def get(url: str) -> tuple[int, bytes]:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.read()

    try:
        assert waiting.wait(300), output()
        out = output()
        assert "reached test accuracy" in out and "Training has stopped" in out, out
        base = re.search(r"dashboard: +(http://127\.0\.0\.1:\d+)/dashboard", out)
        assert base is not None, out
        http = base.group(1)
        assert proc.poll() is None  # still up after the summary
        status = json.loads(get(f"{http}/api/status")[1])
        assert status["finished"]["reason"] == "target_accuracy"
        assert status["clients"] == 0 and status["accepted_results"] > 0
        history = json.loads(get(f"{http}/api/history")[1])
        assert history["evaluations"]["rows"], history
        for page, needle in (("/dashboard", b"<html"), ("/", b"<html")):
            code, body = get(http + page)
            assert code == 200 and needle in body.lower(), page
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            # where it hangs: faulthandler (PYTHONFAULTHANDLER) prints every thread's stack
            proc.send_signal(signal.SIGABRT)
            proc.wait(30)
            reader.join(10)
            raise AssertionError("no exit within 60 s of Ctrl-C:\n" + output()) from None
        assert code == 0, output()
        reader.join(10)
        assert "Traceback" not in output(), output()
        try:
            get(f"{http}/api/status")
            raise AssertionError("still serving after Ctrl-C")
        except urllib.error.URLError:
            pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        os.close(master)
