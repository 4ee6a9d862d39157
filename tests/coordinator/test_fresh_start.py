"""A store whose every checkpoint is damaged is an error at start, not a silent
restart from version 0 that drops every acknowledged result."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.runtime.service import CoreService
from coordinator.runtime.stores import FreshStartRefused
from storage.errors import NoCheckpoint
from storage.store import CheckpointStore
from tests.coordinator.coord_helpers import digits, make_job

ROOT = Path(__file__).resolve().parents[2]


def _store_with_checkpoints(path: Path) -> None:
    service = CoreService(make_job(), store=path, dataset=digits())
    service.start()
    service.checkpoint_now().result(30)
    service.stop()


def _damage_every_chunk(path: Path) -> None:
    with sqlite3.connect(path) as c:
        c.execute("UPDATE chunks SET data = zeroblob(length(data))")


def test_all_checkpoints_damaged_refuses_to_start(tmp_path: Path) -> None:
    store = tmp_path / "run.db"
    _store_with_checkpoints(store)
    _damage_every_chunk(store)
    with pytest.raises(FreshStartRefused, match="none verifies"):
        CoreService(make_job(), store=store, dataset=digits()).prepare()
    # Quarantined by that attempt, they still count: a second start refuses too.
    with pytest.raises(FreshStartRefused, match="--allow-fresh-start"):
        CoreService(make_job(), store=store, dataset=digits()).prepare()
    service = CoreService(make_job(), store=store, dataset=digits(), allow_fresh_start=True)
    service.start()
    assert service.core is not None and service.core.version == 0
    service.stop()


def test_a_fresh_start_keeps_the_damaged_checkpoints(tmp_path: Path) -> None:
    """Issue 34: the fresh run's first save replaced every quarantined version (their
    numbers are free again); they are kept, in a copy beside the store."""
    store = tmp_path / "run.db"
    _store_with_checkpoints(store)
    _damage_every_chunk(store)
    with CheckpointStore.open(store, readonly=True) as s:
        damaged = [(r.version, r.manifest_sha256) for r in s.backend.records()]
    assert damaged
    service = CoreService(make_job(), store=store, dataset=digits(), allow_fresh_start=True)
    service.start()
    assert service.checkpoint_now().result(30) == 0
    service.stop()
    (kept,) = tmp_path.glob("run.db.damaged-*")
    with CheckpointStore.open(kept, readonly=True) as s:
        assert [(r.version, r.manifest_sha256) for r in s.backend.records()] == damaged
        with pytest.raises(NoCheckpoint):
            s.load_latest(quarantine=False)  # still the damaged ones, as they were
    with CheckpointStore.open(store) as s:
        assert s.load_latest().version == 0


def test_an_empty_store_starts_fresh_without_asking(tmp_path: Path) -> None:
    service = CoreService(make_job(), store=tmp_path / "new.db", dataset=digits())
    service.prepare()
    service.start()
    assert service.core is not None and service.core.version == 0
    service.stop()


def test_the_cli_exits_with_the_reason_before_serving(tmp_path: Path) -> None:
    store = tmp_path / "run.db"
    _store_with_checkpoints(store)
    _damage_every_chunk(store)
    cmd = [sys.executable, "-m", "crowdgrad", "coordinator", "--port", "0", "--store", str(store)]
    cmd += ["--widths", "64,16,10"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert "none verifies" in out and "join with" not in out
