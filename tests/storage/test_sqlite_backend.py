from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from nn.spec import ModelSpec
from storage import Checkpoint, CheckpointStore, ManifestRecord, SqliteChunkStore, StorageError


def _chunks(n: int) -> list[tuple[np.ndarray, ...]]:
    return [(np.full(100, i, np.uint8), np.full(7, 255 - i, np.uint8)) for i in range(n)]


def _record(version: int, n: int) -> ManifestRecord:
    return ManifestRecord(
        version=version,
        created_at=0.0,
        nbytes=107 * n,
        n_chunks=n,
        quarantined=False,
        manifest=b"{}",
        manifest_sha256="x",
    )


def test_commit_writes_parts_back_to_back(tmp_path: Path) -> None:
    store = SqliteChunkStore(tmp_path / "s.db")
    store.commit(1, _chunks(3), lambda: _record(1, 3))
    got = list(store.iter_chunks(1))
    assert [i for i, _ in got] == [0, 1, 2]
    assert got[1][1] == bytes([1] * 100 + [254] * 7)
    store.close()


def test_a_failed_commit_leaves_nothing_behind(tmp_path: Path) -> None:
    store = SqliteChunkStore(tmp_path / "s.db")

    def boom() -> ManifestRecord:
        raise RuntimeError("crash between chunks and manifest")

    with pytest.raises(RuntimeError):
        store.commit(1, _chunks(4), boom)
    assert store.records() == [] and list(store.iter_chunks(1)) == []
    with pytest.raises(ValueError, match="does not match"):
        store.commit(1, _chunks(4), lambda: _record(1, 3))
    assert list(store.iter_chunks(1)) == []
    store.commit(1, _chunks(2), lambda: _record(1, 2))
    assert [r.version for r in store.records()] == [1]
    store.close()


def test_a_snapshot_does_not_see_a_concurrent_commit(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    spec = ModelSpec.preset("tiny")
    writer = CheckpointStore.open(path)
    writer.save(Checkpoint(version=1, created_at=0.0, params=spec.init_params(1)))
    reader = CheckpointStore.open(path, readonly=True)
    with reader.backend.snapshot():
        assert reader.versions() == [1]
        writer.save(Checkpoint(version=2, created_at=0.0, params=spec.init_params(2)))
        writer.backend.delete([1])
        assert reader.versions() == [1]
        assert reader.load(1).params.array_equal(spec.init_params(1))
    assert reader.versions() == [2]
    reader.close()
    writer.close()


def test_not_a_store_is_a_clear_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"definitely not sqlite" * 100)
    with pytest.raises(StorageError, match="not a readable crowdgrad store"):
        SqliteChunkStore(junk)
    with pytest.raises(StorageError, match="no such store"):
        SqliteChunkStore(tmp_path / "absent.db", readonly=True)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t(x)").connection.close()
    with pytest.raises(StorageError, match="no such table: meta"):
        SqliteChunkStore(other, readonly=True)
    with pytest.raises(ValueError, match="synchronous"):
        SqliteChunkStore(tmp_path / "s.db", synchronous="OFF")


def test_store_file_is_wal_and_folds_on_close(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = CheckpointStore.open(path)
    store.save(
        Checkpoint(version=1, created_at=0.0, params=ModelSpec.preset("small").init_params(1))
    )
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    store.close()
    wal = tmp_path / "s.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0
