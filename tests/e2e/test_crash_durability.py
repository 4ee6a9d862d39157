"""Nothing acknowledged is lost: SIGKILL a real coordinator at seeded random moments.

A coordinator subprocess (``python -m crowdgrad coordinator --store ...``) trains
with real client subprocesses that log every acknowledgement they receive. The
coordinator is killed with SIGKILL at random moments (training, and the
checkpoints it writes every few versions and for held acks) and restarted on the
same port each time. After every kill: the store opens, every checkpoint
verifies, the newest one is bitwise the model it was when first seen (a committed
version, never a partial one), versions never go back, and every task id a client
saw acknowledged is among the newest checkpoint's applied results.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from coordinator.core import events as ev
from coordinator.core.config import JobConfig
from coordinator.runtime.journal import journal_path
from coordinator.runtime.service import CoreService
from protocol import messages as m
from storage import CheckpointStore, DeltaLog
from tests.e2e.e2e_helpers import ROOT, clients, digits_job, free_port, running

#: A desktop client that appends each ack promising its result is in the model to a file.
ACK_LOGGING_CLIENT = """
import asyncio, sys
from client import session
from client.desktop import DesktopClient
from protocol import messages as m

url, name, path, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
out = open(path, "a", buffering=1)
receive = session.ClientSession.receive

def logged(self, message, now):
    if isinstance(message, m.Ack) and (message.accepted or message.reason == "duplicate"):
        out.write(f"{message.task_id} {message.reason or 'accepted'}\\n")
    return receive(self, message, now)

session.ClientSession.receive = logged
client = DesktopClient(url, name=name, flops=1e9, seed=seed, backoff_base=0.05, backoff_cap=0.5)
sys.exit(asyncio.run(client.run()))
"""

ENV = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


#: A job whose results are in-place sub-model merges: acks wait for the journal.
JOURNAL_JOB = """
name = "journaled"
[model]
widths = [64, 128, 10]
[data]
dataset = "digits"
batch = 16
[strategy]
name = "decentral-async"
tau = 10
lr = 0.1
window = 1
[submodel]
mode = "ist"
fraction = 0.25
[stop]
max_versions = 1000000
patience = 0
"""


def _coordinator(
    store: Path, port: int, log: Path, job: Path | None = None
) -> subprocess.Popen[bytes]:
    args = [
        *("--port", str(port), "--store", str(store), "--dataset", "digits"),
        *("--widths", "64,64,10", "--strategy", "decentral-async", "--tau", "10"),
        *("--lr", "0.1", "--batch", "16", "--max-versions", "1000000", "--patience", "0"),
        *("--checkpoint-every", "7"),
    ]
    if job is not None:  # the job file's model and strategy, the same store and port
        args = [*("--job", str(job)), *("--port", str(port), "--store", str(store))]
        args += ["--checkpoint-every", "7"]
    with log.open("ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "crowdgrad", "coordinator", *args],
            cwd=ROOT,
            env=ENV,
            stdout=err,  # its console says what it refused and why
            stderr=err,
        )


def _wait_ready(proc: subprocess.Popen[bytes], port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"coordinator exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("coordinator did not come up")


def _acked(logs: list[Path]) -> set[str]:
    ids: set[str] = set()
    for path in logs:
        if path.exists():
            ids.update(line.split()[0] for line in path.read_text().splitlines() if line.strip())
    return ids


def _check_store(store: Path, seen: dict[int, str], newest: int, acked: set[str]) -> int:
    """The invariants after a kill; returns the newest version."""
    with CheckpointStore.open(store) as s:
        bad = [r for r in s.verify() if not r.ok]
        assert not bad, f"corrupt checkpoints after a kill: {bad}"
        if not s.versions():  # killed before the first commit: nothing may be acked yet
            assert not acked and newest == -1, f"acked {sorted(acked)} with no checkpoint"
            return newest
        ckpt = s.load_latest()
    digest = hashlib.sha256(ckpt.params.data.tobytes()).hexdigest()
    assert seen.setdefault(ckpt.version, digest) == digest, f"v{ckpt.version} changed"
    assert ckpt.version >= newest, f"went back from v{newest} to v{ckpt.version}"
    lost = acked - set(ckpt.applied_results)
    assert not lost, f"acknowledged but not in v{ckpt.version}: {sorted(lost, key=int)}"
    return ckpt.version


def _check_journaled(store: Path, acked: set[str], newest: int) -> int:
    """After a kill of a journaled job: every acked id is in the newest checkpoint
    or in the journal's run of merges that follows it (what a restart replays)."""
    with CheckpointStore.open(store) as s:
        assert all(r.ok for r in s.verify()), "corrupt checkpoints after a kill"
        ckpt = s.load_latest() if s.versions() else None
    version = -1 if ckpt is None else ckpt.version
    applied = set() if ckpt is None else set(ckpt.applied_results)
    log = DeltaLog(journal_path(store))
    try:
        for entry in log.replay(after_version=max(version, 0)):
            if entry.version != max(version, 0) + 1:
                break
            applied.add(entry.result_id)
            version = entry.version
    finally:
        log.close()
    lost = acked - applied
    assert not lost, f"acknowledged but neither checkpointed nor journaled: {sorted(lost)}"
    assert version >= newest, f"went back from v{newest} to v{version}"
    return version


def _crash_loop(tmp_path: Path, kills: int, seed: int, *, journaled: bool = False) -> None:
    rng = random.Random(seed)
    store, port = tmp_path / "store.db", free_port()
    job = None
    if journaled:
        job = tmp_path / "job.toml"
        job.write_text(JOURNAL_JOB)
    url = f"ws://127.0.0.1:{port}/ws"
    logs = [tmp_path / f"acks{i}.txt" for i in range(2)]
    err = tmp_path / "coordinator.log"
    seen: dict[int, str] = {}
    newest = -1
    coord = _coordinator(store, port, err, job)
    _wait_ready(coord, port)
    clients = [
        subprocess.Popen(
            [sys.executable, "-c", ACK_LOGGING_CLIENT, url, f"c{i}", str(p), str(seed + i)],
            cwd=ROOT,
            env=ENV,
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / f"client{i}.log").open("ab"),
        )
        for i, p in enumerate(logs)
    ]
    try:
        for _ in range(kills):
            time.sleep(rng.uniform(0.2, 1.5))
            coord.send_signal(signal.SIGKILL)
            coord.wait(10)
            if journaled:
                newest = _check_journaled(store, _acked(logs), newest)
            else:
                newest = _check_store(store, seen, newest, _acked(logs))
            coord = _coordinator(store, port, err, job)
            _wait_ready(coord, port)
        for i, c in enumerate(clients):
            why = (tmp_path / f"client{i}.log").read_text(errors="replace")[-2000:]
            if c.poll() is not None:  # what the coordinator said about it
                said = err.read_text(errors="replace").splitlines()
                why += "\n".join(ln for ln in said if "reject" in ln or "refus" in ln)[-3000:]
            assert c.poll() is None, f"a client died: {why}"
    finally:
        if coord.poll() is None:
            coord.send_signal(signal.SIGKILL)
            coord.wait(10)
        for c in clients:
            if c.poll() is None:
                c.kill()
            c.wait(10)
    acked = _acked(logs)
    # not vacuous: training went on across the restarts and acks did get through
    assert len(acked) >= kills, f"only {len(acked)} acks in {kills} runs"
    if journaled:
        assert _check_journaled(store, acked, newest) >= len(acked)
        return
    newest = _check_store(store, seen, newest, acked)
    assert len(seen) >= kills // 2, f"only {len(seen)} distinct versions seen"


@pytest.mark.parametrize("strategy", ["decentral-async", "decentral-sync"])
def test_an_ack_leaves_only_after_its_checkpoint_commits(strategy: str, tmp_path: Path) -> None:
    """In process: at the moment each ack reaches the network, the newest committed
    checkpoint already holds its result (sync: once the round's version is written)."""
    job = digits_job(strategy, strategy={"clients_per_round": 2}, stop={"target_accuracy": None})
    path = tmp_path / "s.db"
    acks: list[tuple[str, bool]] = []
    reader: list[CheckpointStore] = []

    def check(outputs: list[ev.Output]) -> None:  # on the core thread, as the server's sink
        for o in outputs:
            if isinstance(o, ev.Send) and isinstance(o.message, m.Ack) and o.message.accepted:
                if not reader:
                    reader.append(CheckpointStore.open(path))
                applied = reader[0].load_latest(quarantine=False).applied_results
                acks.append((o.message.task_id, o.message.task_id in applied))

    with running(job, store=path) as (bg, service, rec):
        assert service.ack_durable
        service.add_sink(check)
        with clients(bg.url, ["a", "b"]):
            assert rec.wait_for(lambda: len(acks) >= 12, 60), (service.stats, acks)
        assert service.stats.durable_checkpoints >= 1
    for r in reader:
        r.close()
    assert all(ok for _, ok in acks), acks


def test_ack_durable_needs_a_store_and_a_positive_interval(tmp_path: Path) -> None:
    job: JobConfig = digits_job()
    with pytest.raises(ValueError, match="ack_durable: needs a store"):
        CoreService(job, ack_durable=True)
    with pytest.raises(ValueError, match="durable_interval"):
        CoreService(job, store=tmp_path / "s.db", durable_interval=0)
    assert not CoreService(job).ack_durable
    assert not CoreService(job, store=tmp_path / "s.db", ack_durable=False).ack_durable


def test_acknowledged_results_survive_kill_9(tmp_path: Path) -> None:
    _crash_loop(tmp_path, kills=10, seed=1)


def test_journaled_results_survive_kill_9(tmp_path: Path) -> None:
    """The same with sub-model results merged in place: their acks come from the
    journal, and what a restart replays holds every one of them."""
    _crash_loop(tmp_path, kills=6, seed=3, journaled=True)


@pytest.mark.slow
def test_acknowledged_results_survive_30_kills(tmp_path: Path) -> None:
    _crash_loop(tmp_path, kills=32, seed=2)
