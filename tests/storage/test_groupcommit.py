from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from storage import DeltaEntry, DeltaLog, GroupCommit, StorageError


def _entry(rid: str) -> DeltaEntry:
    return DeltaEntry(
        result_id=rid, base_version=0, version=1, weight=1.0, delta=np.ones(64, np.float32)
    )


def test_concurrent_submits_all_become_durable(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    log = DeltaLog(path)
    gc = GroupCommit(log, max_batch=64)
    futures = []
    lock = threading.Lock()

    def producer(k: int) -> None:
        for i in range(50):
            f = gc.submit(_entry(f"{k}-{i}"))
            with lock:
                futures.append(f)

    threads = [threading.Thread(target=producer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for f in futures:
        assert f.result(timeout=30) is None
    gc.close()
    assert gc.entries == 200  # how they batch is timing: the gated test pins it
    log.close()
    with DeltaLog(path) as again:
        assert len(again.result_ids()) == 200
    with pytest.raises(StorageError, match="closed"):
        gc.submit(_entry("late"))


class GatedLog(DeltaLog):
    """A real DeltaLog whose first append waits for the test: entries submitted
    meanwhile must then go in shared batches, not one fsync each."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.sizes: list[int] = []

    def append(self, entries) -> None:  # type: ignore[override]
        entries = list(entries)
        self.entered.set()
        self.gate.wait(30)
        self.sizes.append(len(entries))
        super().append(entries)


def test_entries_queued_during_an_append_share_the_next_ones(tmp_path: Path) -> None:
    log = GatedLog(tmp_path / "s.db")
    gc = GroupCommit(log, max_batch=64)
    first = gc.submit(_entry("first"))
    assert log.entered.wait(30)  # the writer is inside the first append
    waiting = [gc.submit(_entry(f"w{i}")) for i in range(100)]
    log.gate.set()
    for f in [first, *waiting]:
        assert f.result(timeout=30) is None
    gc.close()
    # 1 alone, then the 100 that queued behind it in max_batch-sized appends.
    assert log.sizes == [1, 64, 36]
    assert (gc.batches, gc.entries) == (3, 101)
    log.close()


def test_a_failed_append_fails_every_waiter_of_that_batch(tmp_path: Path) -> None:
    log = DeltaLog(tmp_path / "s.db")
    log.close()  # appends now fail: the connection is closed
    gc = GroupCommit(log)
    fut = gc.submit(_entry("x"))
    with pytest.raises(Exception, match="closed"):
        fut.result(timeout=30)
    gc.close()


def test_a_full_queue_makes_the_producer_wait_for_the_disk(tmp_path: Path) -> None:
    """``max_queued_bytes``: while an append is held, a producer past the bound
    waits (memory does not grow), and goes on once the disk catches up."""
    log = GatedLog(tmp_path / "s.db")
    gc = GroupCommit(log, max_queued_bytes=3 * 4000)
    delta = np.zeros(1000, np.float32)  # 4,000 bytes each
    first = gc.submit(
        DeltaEntry(result_id="r0", base_version=0, version=1, weight=1.0, delta=delta)
    )
    assert log.entered.wait(10)  # the writer holds r0 in a gated append
    for i in (1, 2):
        gc.submit(DeltaEntry(result_id=f"r{i}", base_version=i, version=i + 1, weight=1.0,
                             delta=delta))  # fmt: skip
    blocked = threading.Event()
    done = threading.Event()

    def producer() -> None:
        blocked.set()
        gc.submit(DeltaEntry(result_id="r3", base_version=3, version=4, weight=1.0, delta=delta))
        done.set()

    t = threading.Thread(target=producer)
    t.start()
    assert blocked.wait(10)
    assert not done.wait(0.3)  # 3 x 4,000 bytes queued: the fourth waits
    assert gc.queued_bytes == 3 * 4000
    log.gate.set()
    assert done.wait(10) and first.result(10) is None
    t.join(10)
    gc.close()
    assert gc.queued_bytes == 0 and gc.waited_s > 0.2
    with DeltaLog(tmp_path / "s.db") as again:
        assert [e.result_id for e in again.replay()] == ["r0", "r1", "r2", "r3"]
