"""``crowdgrad checkpoint``: the operator's view of a store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from crowdgrad.cli import main
from nn.modelfile import load_model
from nn.spec import ModelSpec
from storage import Checkpoint, CheckpointStore


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    path = tmp_path / "s.db"
    spec = ModelSpec.preset("small")
    with CheckpointStore.open(path) as store:
        for v in (1, 2):
            store.save(
                Checkpoint(
                    version=v,
                    created_at=1.7e9 + v,
                    params=spec.init_params(v),
                    optimizer={"m": np.full(4, v, np.float32), "step": v},
                    metadata={"job": "demo"},
                    applied_results=(f"r{v}",),
                )
            )
    return path


def test_list_json(store_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoint", "list", "--store", str(store_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["version"] for r in rows] == [1, 2]
    assert rows[0]["widths"] == [10, 16, 16, 16, 10] and rows[0]["n_applied"] == 1


def test_list_table_and_show_in_a_real_process(store_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "crowdgrad", "checkpoint", "list", "--store", str(store_path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "checkpoints in" in out and "10,16,16,16,10" in out


def test_show_verify_restore_export(
    store_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--store", str(store_path), "--json"]
    assert main(["checkpoint", "show", *base, "--version", "1"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["version"] == 1 and shown["optimizer"]["m"] == "array float32 [4]"
    assert main(["checkpoint", "verify", *base]) == 0
    assert all(r["ok"] for r in json.loads(capsys.readouterr().out))
    assert main(["checkpoint", "restore", *base, "--version", "1"]) == 0
    assert json.loads(capsys.readouterr().out) == {"restored_from": 1, "version": 3}
    out = tmp_path / "model.npz"
    assert main(["checkpoint", "export", *base, "--out", str(out)]) == 0
    capsys.readouterr()
    params, extra, meta = load_model(out)
    assert params.array_equal(ModelSpec.preset("small").init_params(1))
    assert np.array_equal(extra["optimizer.m"], np.full(4, 1, np.float32))
    manifest = json.loads(out.with_suffix(".json").read_text())
    assert manifest["version"] == 3 and manifest["metadata"]["restored_from"] == 1
    assert manifest["scalars"]["optimizer"] == {"step": 1} and meta["checkpoint_version"] == 3


def test_verify_fails_on_corruption_and_errors_name_the_problem(
    store_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sqlite3

    conn = sqlite3.connect(store_path)
    conn.execute("UPDATE chunks SET data = zeroblob(length(data)) WHERE version=2 AND idx=1")
    conn.commit()
    conn.close()
    assert main(["checkpoint", "verify", "--store", str(store_path)]) == 1
    assert "CORRUPT" in capsys.readouterr().out
    assert main(["checkpoint", "show", "--store", str(tmp_path / "nope.db")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["checkpoint", "restore", "--store", str(store_path)]) == 2
    assert "--version is required" in capsys.readouterr().err
    assert main(["checkpoint", "show", "--store", str(store_path), "--version", "9"]) == 2
    assert "no checkpoint v9" in capsys.readouterr().err


def test_show_is_a_summary_and_restore_a_sentence(
    store_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["checkpoint", "show", "--store", str(store_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"Checkpoint v2 in {store_path}, written 2023-11-14 22:13:22 UTC")
    assert "10-16-16-16-10" in lines[1] and "890 parameters" in lines[1]
    assert any("no evaluation stored" in line for line in lines)
    assert len(lines) < 10 and "{" not in "".join(lines)
    assert main(["checkpoint", "show", "--store", str(store_path), "--full"]) == 0
    assert json.loads(capsys.readouterr().out)["optimizer"]["m"] == "array float32 [4]"
    assert main(["checkpoint", "restore", "--store", str(store_path), "--version", "1"]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"Restored checkpoint v1 of {store_path} as its newest checkpoint, v3")
    assert main(["checkpoint", "list"]) == 2
    assert "list: --store FILE is required" in capsys.readouterr().err


def test_show_says_why_a_finished_run_ended(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from coordinator.core.assembly import build_core
    from coordinator.core.config import parse_job
    from coordinator.runtime.persist import to_checkpoint
    from nn.data import load_dataset
    from testkit.loopback import Loopback

    job = parse_job(
        {
            "model": {"widths": [64, 16, 10]},
            "data": {"shards": 4, "batch": 8},
            "strategy": {"tau": 2},
            "stop": {"max_versions": 2},
        }
    )
    core = build_core(job, seed=1, dataset=load_dataset("digits", seed=0))
    lb = Loopback(core)
    lb.add_client("c0")
    lb.run(until=100)
    assert core.finished is not None
    path = tmp_path / "done.db"
    with CheckpointStore.open(path) as store:
        store.save(to_checkpoint(job, core.state_dict(), created_at=1.7e9))
    assert main(["checkpoint", "show", "--store", str(path)]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "ended:" in x]
    assert f"max_versions at v{core.version}, accuracy {core.finished.accuracy:.4f}" in line


def test_an_incremental_checkpoint_lists_its_base_and_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from storage import ParamsPatch, StoreLimits

    path, spec = tmp_path / "inc.db", ModelSpec.preset("medium")
    params = spec.init_params(0)
    with CheckpointStore.open(path, limits=StoreLimits(max_chunk_bytes=4096)) as store:
        store.save(Checkpoint(version=1, created_at=1.7e9, params=params))
        plan = store.param_groups(spec)
        params.W[1][:3] += 1.0  # rows 0-2 of layer 1: its first group
        changed = [i for i, g in enumerate(plan) if g.layer == 1 and g.row_start == 0]
        patch = ParamsPatch.of(params, plan, changed, base=1)
        store.save(Checkpoint(version=2, created_at=1.7e9 + 1, params=patch))
    assert main(["checkpoint", "list", "--store", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["version"], r["base"]) for r in rows] == [(1, None), (2, 1)]
    assert rows[1]["nbytes"] < rows[0]["nbytes"] / 10
    assert main(["checkpoint", "list", "--store", str(path)]) == 0
    assert "patch on v1" in capsys.readouterr().out
    assert main(["checkpoint", "verify", "--store", str(path)]) == 0
