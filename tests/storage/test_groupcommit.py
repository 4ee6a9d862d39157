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


def test_concurrent_submits_share_fsyncs_and_all_become_durable(tmp_path: Path) -> None:
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
    assert gc.entries == 200 and 1 <= gc.batches <= 200
    log.close()
    with DeltaLog(path) as again:
        assert len(again.result_ids()) == 200
    with pytest.raises(StorageError, match="closed"):
        gc.submit(_entry("late"))


def test_a_failed_append_fails_every_waiter_of_that_batch(tmp_path: Path) -> None:
    log = DeltaLog(tmp_path / "s.db")
    log.close()  # appends now fail: the connection is closed
    gc = GroupCommit(log)
    fut = gc.submit(_entry("x"))
    with pytest.raises(Exception, match="closed"):
        fut.result(timeout=30)
    gc.close()
