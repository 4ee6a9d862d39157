"""Runs persist by default (issue 36): ``crowdgrad coordinator`` without ``--store``
keeps its run in ``./<job name>.crowdgrad.db``, says where, resumes it when started
again, refuses a second coordinator on it and a store of another model;
``--no-store`` keeps nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from crowdgrad.cli import main
from crowdgrad.commands.runstore import default_store
from storage.store import CheckpointStore

ROOT = Path(__file__).resolve().parents[2]
START_BOUND_S = 120.0


class Coordinator:
    """``crowdgrad coordinator --port 0`` run in ``cwd``; its output read by a thread."""

    def __init__(self, cwd: Path, *extra: str) -> None:
        cmd = [sys.executable, "-m", "crowdgrad", "coordinator", "--port", "0", *extra]
        env = {**os.environ, "COLUMNS": "300", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self.stored = threading.Event()  # the banner's store line was printed
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.strip().startswith("store:"):
                self.stored.set()
        self.stored.set()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def banner(self) -> str:
        assert self.stored.wait(START_BOUND_S), self.output
        return self.output

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(30)

    def finish(self) -> tuple[int, str]:
        code = self.proc.wait(START_BOUND_S)
        return code, self.output


def test_the_default_store_is_named_after_the_job_in_the_working_directory(tmp_path) -> None:
    assert default_store("job", tmp_path) == tmp_path / "job.crowdgrad.db"
    assert default_store("digits run/2", tmp_path).name == "digits_run_2.crowdgrad.db"
    assert default_store("..", tmp_path).name == "job.crowdgrad.db"  # never the parent
    assert default_store("", tmp_path).name == "job.crowdgrad.db"


def test_a_run_without_store_persists_and_a_restart_resumes_it(tmp_path: Path) -> None:
    store = tmp_path / "job.crowdgrad.db"
    first = Coordinator(tmp_path, "--widths", "64,16,10")
    out = first.banner()
    assert f"store:      {store} (the default, named after the job; --no-store" in out, out
    assert "no checkpoint yet, starting from model v0" in out
    # The same job in the same folder: one coordinator a store.
    second = Coordinator(tmp_path, "--widths", "64,16,10")
    code, out2 = second.finish()
    assert code == 2, out2
    assert f"--store: {store} is in use by another coordinator (pid {first.proc.pid})" in out2
    assert "join with" not in out2
    assert first.stop() == 0, first.output  # SIGTERM writes the final checkpoint
    with CheckpointStore.open(store, readonly=True) as s:
        assert s.versions() == [0]
    again = Coordinator(tmp_path, "--widths", "64,16,10")
    assert "resumed from checkpoint 0 (model v0)" in again.banner(), again.output
    assert again.stop() == 0
    # Another model under the default job name is refused, saying what to do.
    other = Coordinator(tmp_path, "--widths", "64,32,10")
    code, out3 = other.finish()
    assert code == 2 and "Traceback" not in out3, out3
    assert f"{store} holds a run of model [64, 16, 10] (checkpoint v0), not this job's " in out3
    assert "[64, 32, 10]; it is the default store of every run named 'job'" in out3


def test_no_store_keeps_nothing(tmp_path: Path) -> None:
    c = Coordinator(tmp_path, "--widths", "64,16,10", "--no-store")
    assert "store:      none (--no-store): nothing is kept when this stops" in c.banner()
    assert c.stop() == 0, c.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_store_and_no_store_together_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["coordinator", "--store", "x.db", "--no-store"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
