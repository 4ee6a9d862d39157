"""The journal (coordinator/runtime/journal.py): a job whose results are in-place sub-model
merges acknowledges each once its merge is logged, without a checkpoint, and a
coordinator killed with SIGKILL restarts with every acknowledged result in the
model, by replaying the log on the last checkpoint (real processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from coordinator.core import events as ev
from coordinator.core.config import parse_job
from coordinator.runtime import snapshots
from coordinator.runtime.journal import Journal
from coordinator.runtime.service import CoreService
from nn.spec import ModelSpec
from nn.subnet import Subnet
from protocol import messages as m
from storage import CheckpointStore
from tests.coordinator.coord_helpers import result_messages
from tests.coordinator.journal_worker import JOB
from tests.coordinator.test_incremental_checkpoints import Tasks

WORKER = Path(__file__).with_name("journal_worker.py")


def _run_and_kill(
    store: Path, results: int, *, dump: bool, after_s: float = 0.0, until: str = "ready"
) -> list[str]:
    """Start the worker, SIGKILL it (after ``dumped``, or ``after_s`` after the first
    line starting with ``until``)."""
    args = [sys.executable, str(WORKER), str(store), str(results), *(["dump"] if dump else [])]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    go = threading.Event()

    def pump() -> None:
        for line in proc.stdout:
            if line.endswith("\n"):
                lines.append(line.strip())
                if line.startswith("dumped" if dump else until):
                    go.set()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    if not go.wait(60):
        proc.kill()
        raise AssertionError(f"worker: {proc.stderr.read()}")
    time.sleep(after_s)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    t.join(10)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
    return lines


def _restored(store: Path) -> tuple[np.ndarray, int, set[int]]:
    with CoreService(parse_job(JOB), store=store) as service:
        return service.call(
            lambda c: (c.params.data.copy(), c.version, set(c.book.accepted_ids()))
        ).result(30)


def test_a_killed_coordinator_replays_every_acknowledged_merge_bit_for_bit(tmp_path: Path) -> None:
    store = tmp_path / "job.db"
    lines = _run_and_kill(store, 10, dump=True)
    assert sum(line.startswith("acked") for line in lines) == 10
    dumped = np.load(f"{store}.npy")
    params, version = dumped[:-1], int(dumped[-1])
    with CheckpointStore.open(store, readonly=True) as s:
        stored = s.versions()
    assert stored and max(stored) < version == 10  # checkpoints every 7: v7 and the log
    got, got_version, accepted = _restored(store)
    assert got_version == version and len(accepted) == 10
    np.testing.assert_array_equal(got, params)


@pytest.mark.parametrize("after_s", [0.05, 0.3])
def test_no_acknowledged_result_is_lost_whenever_the_kill_comes(
    tmp_path: Path, after_s: float
) -> None:
    store = tmp_path / "job.db"
    lines = _run_and_kill(store, 400, dump=False, after_s=after_s)
    acked = {int(line.split()[1]) for line in lines if line.startswith("acked")}
    _, version, accepted = _restored(store)
    assert acked <= accepted, sorted(acked - accepted)
    assert version >= len(acked)


def test_a_run_killed_before_anything_was_durable_never_has_its_task_ids_reused(
    tmp_path: Path,
) -> None:
    """Runs that issue tasks and die with no checkpoint and no journal entry leave
    clients holding their ids: each next run issues ids above them (the store keeps
    the reserved range), so a kept result never matches another task."""
    store, issued = tmp_path / "job.db", set()
    for _ in range(3):
        lines = _run_and_kill(store, 0, dump=False, until="task")
        ids = {int(line.split()[1]) for line in lines if line.startswith("task")}
        assert ids and not ids & issued, (sorted(ids), sorted(issued))
        issued |= ids
    with CheckpointStore.open(store, readonly=True) as s:
        assert not s.versions()  # nothing but the reservation was left behind
        assert s.task_ids_reserved() > max(issued)


def _journaled_service(store: Path) -> tuple[CoreService, Tasks, list[m.Ack]]:
    """A journaled job with no periodic checkpoint; its tasks and acks as they leave."""
    job = parse_job({**JOB, "checkpoint": {"every_versions": 0}})
    sink, acks = Tasks(), []
    service = CoreService(job, store=store, durable_interval=1e4)
    service.add_sink(sink)
    service.add_sink(
        lambda outs: acks.extend(
            o.message for o in outs if isinstance(o, ev.Send) and isinstance(o.message, m.Ack)
        )
    )
    return service, sink, acks


def test_acks_go_out_from_the_log_without_a_checkpoint(tmp_path: Path) -> None:
    service, sink, acks = _journaled_service(tmp_path / "job.db")
    with service:
        service.submit_connect("a", m.Hello(client="a", codecs=("fp32", "int8")))
        for n in range(1, 6):
            task = sink.next(n)
            for msg in result_messages(task, codec=task.upload_codec):
                service.submit_receive("a", msg, len(m.encode(msg)))
        deadline = time.monotonic() + 10
        while len(acks) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(acks) == 5 and all(a.accepted for a in acks)
        # no snapshot was taken for them: the log made them durable
        assert service.stats.checkpoints == 0 and service.stats.durable_checkpoints == 0
        # in their int8 wire form: about a quarter of the float32 deltas
        floats = 5 * task.spec.num_params * 4
        assert 0.2 * floats < service.stats.journal["logged_bytes"] < 0.35 * floats


def test_a_step_the_log_cannot_redo_opens_a_gap_until_a_checkpoint_after_it(
    tmp_path: Path,
) -> None:
    spec = ModelSpec(widths=(8, 16, 4))
    journal = Journal(tmp_path / "s.db", spec)
    try:
        sub = Subnet(spec, (np.arange(4),))
        update = np.arange(sub.sub.num_params, dtype=np.float32)
        merged = ev.MergedInPlace(
            task_id=1, version=1, subnet=sub, update=update, scale=0.5, now=0.0
        )
        journal.observe([ev.ModelUpdated(version=1, contributions=1, now=0.0), merged])
        assert journal.gap is None
        journal.observe([ev.ModelUpdated(version=2, contributions=1, now=0.0)])  # a rebase
        assert journal.gap == 2
        journal.committed(1, frozenset())
        assert journal.gap == 2
        journal.committed(2, frozenset())
        assert journal.gap is None
        done = threading.Event()
        journal.sealed(0, lambda cover, ok: done.set())  # nothing new: no report
        assert not done.is_set()
        journal.observe([merged])
        journal.sealed(3, lambda cover, ok: done.set() if (cover, ok) == (3, True) else None)
        assert done.wait(10)
        assert 1 in journal.durable
        ((task_id, version, subnet, logged, scale),) = journal.merges(after_version=0)
        assert (task_id, version, scale) == (1, 1, 0.5)
        assert np.array_equal(subnet.to_wire(), sub.to_wire())
        assert np.array_equal(logged, update)
    finally:
        journal.close()


def test_a_checkpoint_taken_while_merges_go_on_restores_with_the_journal(
    tmp_path: Path, monkeypatch
) -> None:
    """A mapped model's whole checkpoint is copied group by group on the writer
    thread while results keep merging (each group as of its own version); the
    service stops with no final checkpoint, and the restart (that checkpoint,
    then the journal replayed on each group from its own version) has the model
    the first run stopped with, bit for bit."""
    from storage import LiveParams, StoreLimits

    read = LiveParams.read
    first_copied, merged = threading.Event(), threading.Event()

    def held(self, g):  # the writer waits after its first copy until a merge lands
        copy = read(self, g)
        if not first_copied.is_set():
            first_copied.set()
            assert merged.wait(30), "no merge landed while the checkpoint was copied"
        return copy

    monkeypatch.setattr(LiveParams, "read", held)
    monkeypatch.setattr(snapshots, "COPY_MAX_BYTES", 0)  # every patch copied live too
    job = parse_job({**JOB, "checkpoint": {"every_versions": 0}})
    store, limits = tmp_path / "job.db", StoreLimits(max_chunk_bytes=1 << 14)
    sink, rng = Tasks(), np.random.default_rng(3)
    service = CoreService(job, store=store, mapped=True, store_limits=limits, durable_interval=1e4)
    with service:
        service.add_sink(sink)
        service.submit_connect("a", m.Hello(client="a", codecs=("fp32", "int8")))
        for n in range(1, 31):
            task = sink.next(n)
            update = rng.standard_normal(task.spec.num_params).astype(np.float32) * 1e-2
            for msg in result_messages(task, update, codec=task.upload_codec):
                service.submit_receive("a", msg, len(m.encode(msg)))
            if n == 5:
                service.checkpoint_now()  # not waited for: results keep coming
                assert first_copied.wait(30)
            if n == 7:  # task 7 was leased after result 6, sent after the first copy, merged
                merged.set()
        final = service.call(lambda c: c.params.data.copy()).result(30)
    with CheckpointStore.open(store, readonly=True) as s:
        newest = s.load(s.versions()[-1])
    assert newest.version >= 5 and max(newest.as_of) > newest.version  # merges went on
    with CoreService(job, store=store, mapped=True, store_limits=limits) as again:
        restored = again.call(lambda c: c.params.data.copy()).result(30)
        assert again.stats.journal is not None and again.stats.journal["replayed"] > 0
    np.testing.assert_array_equal(restored, final)


def test_no_ack_leaves_before_its_merge_is_in_the_log(tmp_path: Path, monkeypatch) -> None:
    """The journal's append is held: the result is merged but its ack waits;
    released, the ack goes out (and no checkpoint was needed for it)."""
    from storage import DeltaLog

    gate, entered = threading.Event(), threading.Event()
    append = DeltaLog.append

    def held(self, entries):
        entered.set()
        assert gate.wait(30)
        return append(self, entries)

    monkeypatch.setattr(DeltaLog, "append", held)
    service, sink, acks = _journaled_service(tmp_path / "job.db")
    acked = threading.Event()  # set by the sink after the one that gathers acks
    service.add_sink(lambda outs: acks and acked.set())
    with service:
        service.submit_connect("a", m.Hello(client="a", codecs=("fp32", "int8")))
        task = sink.next(1)
        for msg in result_messages(task, codec=task.upload_codec):
            service.submit_receive("a", msg, len(m.encode(msg)))
        assert entered.wait(10)
        # On the core thread, after the result's frames: merged, and its ack held
        # by the service. Only the log's report (which waits on the held append)
        # or a checkpoint (none: the job takes none) releases a held ack.
        state = service.call(lambda c: (c.version, service.stats.acks_held)).result(10)
        assert state == (1, 1)  # merged, and the ack held back...
        assert acks == [] and service.stats.checkpoints == 0  # ...not sent
        gate.set()
        assert acked.wait(10)
        assert [a.accepted for a in acks] == [True] and service.stats.acks_held == 0
        assert service.stats.checkpoints == 0
