from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from nn.spec import PRESETS, ModelSpec
from storage import (
    Checkpoint,
    CheckpointExists,
    CheckpointStore,
    NoCheckpoint,
    RetentionPolicy,
    StoreLimits,
    WriteBudgetExceeded,
)
from storage.layout import encode


def _ckpt(version: int, spec: ModelSpec | None = None, **kw) -> Checkpoint:
    spec = spec or ModelSpec.preset("small")
    return Checkpoint(
        version=version, created_at=100.0 + version, params=spec.init_params(version), **kw
    )


def test_every_preset_up_to_huge_round_trips(tmp_path: Path) -> None:
    presets = [p for p in PRESETS if p != "extreme"]
    assert presets[-1] == "huge"
    with CheckpointStore.open(tmp_path / "all.db") as store:
        for v, name in enumerate(presets):
            spec = ModelSpec.preset(name)
            params = spec.init_params(v)
            opt = {"m": params.data * np.float32(0.5), "step": v}
            store.save(
                Checkpoint(
                    version=v, created_at=0.0, params=params, optimizer=opt, applied_results=(name,)
                )
            )
            back = store.load(v)
            assert back.params.array_equal(params), name
            assert np.array_equal(back.optimizer["m"], opt["m"]) and back.optimizer["step"] == v
            assert back.applied_results == (name,)
            del params, back, opt
            store.delete(v)  # keep the file small; the next preset is a new version
        assert store.versions() == []


def test_chunks_respect_the_limit_and_count_as_writes(tmp_path: Path) -> None:
    limits = StoreLimits(max_chunk_bytes=4096, writes_per_minute=30)
    with CheckpointStore.open(tmp_path / "s.db", limits=limits) as store:
        ck = _ckpt(1, ModelSpec.preset("medium"))
        cost = store.write_cost(ck)
        _, chunks = encode(ck, 4096)
        assert 15 < cost <= 30
        assert cost == len(chunks) + 1 and all(sum(p.nbytes for p in c) <= 4096 for c in chunks)
        info = store.save(ck, now=0.0)
        assert info.n_chunks == len(chunks)
        with pytest.raises(WriteBudgetExceeded):
            store.save(_ckpt(2, ModelSpec.preset("medium")), now=1.0)
        assert store.versions() == [1], "a refused save must write nothing"
        with pytest.raises(ValueError, match="now"):
            store.save(_ckpt(2))
        store.save(_ckpt(2, ModelSpec.preset("medium")), now=60.0)


def test_versions_only_grow(tmp_path: Path) -> None:
    with CheckpointStore.open(tmp_path / "s.db") as store:
        store.save(_ckpt(5))
        with pytest.raises(CheckpointExists, match="not above"):
            store.save(_ckpt(5))
        with pytest.raises(CheckpointExists):
            store.save(_ckpt(3))
        assert store.versions() == [5]


def test_empty_store_and_unknown_version(tmp_path: Path) -> None:
    with CheckpointStore.open(tmp_path / "s.db") as store:
        with pytest.raises(NoCheckpoint):
            store.load_latest()
        with pytest.raises(NoCheckpoint, match="v7"):
            store.load(7)
        with pytest.raises(NoCheckpoint):
            store.delete(7)


def _flip_on_disk(path: Path, needle: bytes) -> None:
    raw = bytearray(path.read_bytes())
    at = raw.find(needle)
    assert at >= 0 and raw.find(needle, at + 1) < 0, "needle must be unique in the file"
    raw[at + len(needle) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_corrupt_chunk_on_disk_is_reported_and_load_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "c.db"
    spec = ModelSpec.preset("medium")
    with CheckpointStore.open(path) as store:
        store.save(_ckpt(1, spec))
        store.save(_ckpt(2, spec))
    # close() folds the WAL into the main file: the bytes to damage are in c.db.
    assert not (tmp_path / "c.db-wal").exists() or (tmp_path / "c.db-wal").stat().st_size == 0
    v2 = spec.init_params(2)
    _flip_on_disk(path, v2.W[1][3].tobytes())
    with CheckpointStore.open(path) as store:
        reports = {r.version: r for r in store.verify()}
        assert reports[1].ok and not reports[2].ok
        assert "layer 1" in reports[2].reason and "checksum" in reports[2].reason
        with caplog.at_level(logging.WARNING, logger="storage.store"):
            ck = store.load_latest()
        assert ck.version == 1 and ck.params.array_equal(spec.init_params(1))
        assert "v2 is corrupt" in caplog.text and "falling back" in caplog.text
        assert [i.quarantined for i in store.list()] == [False, True]
        assert store.versions() == [1]
        # The quarantined version number is free again for the coordinator's next save.
        store.save(_ckpt(2, spec))
        assert store.load_latest().version == 2
        assert all(r.ok for r in store.verify())


def test_prune_keeps_last_n_and_every_kth(tmp_path: Path) -> None:
    with CheckpointStore.open(tmp_path / "s.db") as store:
        for v in range(1, 13):
            store.save(_ckpt(v, ModelSpec.preset("tiny")))
        deleted = store.prune(RetentionPolicy(keep_last=3, keep_every=5))
        assert deleted == [1, 2, 3, 4, 6, 7, 8, 9]
        assert store.versions() == [5, 10, 11, 12]


def test_restore_makes_an_old_version_current_and_keeps_history(tmp_path: Path) -> None:
    with CheckpointStore.open(tmp_path / "s.db") as store:
        store.save(_ckpt(1, optimizer={"step": 1}, metadata={"job": "j"}, applied_results=("a",)))
        store.save(_ckpt(2))
        info = store.restore(1, now=500.0)
        assert info.version == 3 and store.versions() == [1, 2, 3]
        ck = store.load_latest()
        assert ck.params.array_equal(ModelSpec.preset("small").init_params(1))
        assert ck.metadata == {"job": "j", "restored_from": 1}
        assert ck.applied_results == ("a",) and ck.optimizer == {"step": 1}
        assert ck.created_at == 500.0
