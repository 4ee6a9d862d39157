"""Crash safety with real processes: SIGKILL a writer at seeded random moments.

After each kill the store must open, its newest checkpoint must verify and be
bitwise the model of a committed version, and every result the writer printed
as acknowledged must be in that checkpoint or in the replayable delta log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from storage import CheckpointStore, DeltaLog
from tests.storage import crash_worker

HERE = Path(__file__).parent


def _spawn(path: Path, seed: int, run: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(HERE / "crash_worker.py"), str(path), str(seed), str(run), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _kill_after_ready(proc: subprocess.Popen, delay: float) -> list[str]:
    """Wait for ``ready``, let it work ``delay`` s, SIGKILL it; return complete stdout lines."""
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        for line in proc.stdout:  # a torn last line has no newline and is dropped
            if line.endswith("\n"):
                lines.append(line.rstrip("\n"))
                if line.startswith("ready"):
                    ready.set()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    if not ready.wait(30):
        proc.kill()
        proc.wait()
        raise AssertionError(f"worker never got ready: {proc.stderr.read()}")
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    t.join(10)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
    return lines


def _expected_params(applied: tuple[str, ...]) -> np.ndarray:
    data = crash_worker.SPEC.init_params(0).data.copy()
    for rid in applied:
        crash_worker.apply(data, rid)
    return data


def _check_store(path: Path, acked: set[str], max_version: int) -> tuple[int, int]:
    with CheckpointStore.open(path, limits=crash_worker.LIMITS) as store:
        reports = store.verify()
        assert all(r.ok for r in reports), reports
        ckpt = store.load_latest()
    assert 0 <= ckpt.version <= max_version
    # The restored model is exactly the model the writer had at that version.
    assert ckpt.params.data.tobytes() == _expected_params(ckpt.applied_results).tobytes()
    assert len(ckpt.applied_results) == ckpt.version
    with DeltaLog(path) as dlog:
        entries = list(dlog.replay(after_version=ckpt.version))
    versions = [e.version for e in entries]
    assert versions == list(range(ckpt.version + 1, ckpt.version + 1 + len(entries)))
    durable = set(ckpt.applied_results) | {e.result_id for e in entries}
    missing = acked - durable
    assert not missing, f"acknowledged but lost: {sorted(missing)[:5]}"
    return ckpt.version, ckpt.version + len(entries)


def _crash_loop(tmp_path: Path, kills: int, seed: int) -> int:
    """Kill and restart ``kills`` times; returns how many kills landed inside a save."""
    path = tmp_path / "crash.db"
    rng = np.random.default_rng(seed)
    acked: set[str] = set()
    top = 0
    mid_save = 0
    for run in range(kills):
        delay = float(rng.uniform(0.0, 0.4))
        lines = _kill_after_ready(_spawn(path, int(rng.integers(1 << 30)), run), delay)
        mid_save += lines[-1].startswith("saving")
        for line in lines:
            kind, *rest = line.split()
            if kind == "ack":
                acked.update(rest)
            if kind == "ready":
                assert int(rest[0]) >= top, "restart lost versions it had replayed before"
        # Each result bumps the version by one, so no version above this was ever reached.
        max_version = top + sum(len(line.split()) - 1 for line in lines if line.startswith("ack"))
        max_version += 4  # an append that committed but was killed before printing
        _, top = _check_store(path, acked, max_version)
    assert acked, "the writer never acknowledged anything; the test proved nothing"
    return mid_save


def test_kill9_ten_times_loses_nothing_acknowledged(tmp_path: Path) -> None:
    _crash_loop(tmp_path, kills=10, seed=1)


@pytest.mark.slow
def test_kill9_forty_times_loses_nothing_acknowledged(tmp_path: Path) -> None:
    _crash_loop(tmp_path, kills=40, seed=2)


def test_reader_never_sees_a_partial_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "rw.db"
    # Seed the store so the reader has something from its first look.
    subprocess.run(
        [sys.executable, str(HERE / "crash_worker.py"), str(path), "0", "0", "5"],
        check=True,
        capture_output=True,
    )
    writer = _spawn(path, 3, 1)
    reader_code = (
        "import io, json, sys, contextlib\n"
        "from crowdgrad.cli import main\n"
        "seen = set()\n"
        "for _ in range(2000):  # until the writer has committed twice meanwhile\n"
        "    buf = io.StringIO()\n"
        "    with contextlib.redirect_stdout(buf):\n"
        "        rc_list = main(['checkpoint', 'list', '--store', sys.argv[1], '--json'])\n"
        "        rc_verify = main(['checkpoint', 'verify', '--store', sys.argv[1], '--json'])\n"
        "    listed, verified = buf.getvalue().splitlines()\n"
        "    print(json.dumps({'rc': [rc_list, rc_verify], 'listed': json.loads(listed),\n"
        "                      'verified': json.loads(verified)}), flush=True)\n"
        "    seen.add(tuple(r['version'] for r in json.loads(listed)))\n"
        "    if len(seen) > 2:\n"
        "        break\n"
    )
    try:
        reader = subprocess.run(
            [sys.executable, "-c", reader_code, str(path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        writer.kill()
        writer.wait()
    assert reader.returncode == 0, reader.stderr
    seen: set[tuple[int, ...]] = set()
    for line in reader.stdout.splitlines():
        out = json.loads(line)
        assert out["rc"] == [0, 0], out
        assert out["listed"], "the store was seeded, a reader must see a checkpoint"
        assert all(v["ok"] for v in out["verified"]), out["verified"]
        seen.add(tuple(r["version"] for r in out["listed"]))
    assert len(seen) > 1, "the writer never committed while the reader read"
