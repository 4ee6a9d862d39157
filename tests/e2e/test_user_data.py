"""A user's own data file trains through the real CLI and real client processes that
start with an empty cache; a second run with the caches warm moves no shard bytes.
Shards also come by HTTP, cacheable and by range (docs/protocol.md §13)."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from sklearn.datasets import make_classification

from tests.e2e.e2e_helpers import ROOT, clients, digits_job, free_port, running

TARGET = 0.75


def _status(port: int, until, timeout: float = 240.0) -> dict:
    """Poll /api/status until ``until(status)`` (the job's own progress, not a duration)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            st = httpx.get(f"http://127.0.0.1:{port}/api/status", timeout=5).json()
            if until(st):
                return st
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "coordinator did not get there in time"
        time.sleep(0.2)


def _write_data(tmp_path: Path, kind: str) -> str:
    X, y = make_classification(
        n_samples=900, n_features=20, n_informative=8, n_classes=3, class_sep=1.5, random_state=0
    )
    if kind == "npz":
        np.savez(tmp_path / "train.npz", X=X, y=y)
        return 'path = "train.npz"'
    with (tmp_path / "train.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([f"f{i}" for i in range(20)] + ["class"])
        for row, label in zip(X, y, strict=True):
            w.writerow([f"{v:.6f}" for v in row] + [int(label)])
    return 'path = "train.csv"\nlabel = "class"'


def _job(tmp_path: Path, kind: str) -> Path:
    job = tmp_path / "job.toml"
    job.write_text(
        f"""name = "user-{kind}"
[model]
widths = [20, 32, 3]
[data]
{_write_data(tmp_path, kind)}
shards = 4
[strategy]
name = "decentral-async"
lr = 0.05
[stop]
target_accuracy = {TARGET}
max_versions = 3000
[eval]
every_versions = 5
"""
    )
    return job


def _run_job(job: Path, cache: Path, port: int) -> dict:
    """One coordinator and two clients until the job reaches its target; the status then."""
    cmd = [sys.executable, "-m", "crowdgrad", "coordinator", "--job", str(job)]
    cmd += ["--port", str(port), "--keep-running", "--no-store"]
    coord = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _status(port, lambda s: True, timeout=60)
        url = f"ws://127.0.0.1:{port}/ws"
        with clients(url, ["a", "b"], "--cache-dir", str(cache)) as procs:
            st = _status(port, lambda s: s["finished"] is not None)
            for p in procs.values():  # told the job finished: they exit 0
                assert p.wait(60) == 0
        return st
    finally:
        coord.send_signal(signal.SIGINT)
        out, _ = coord.communicate(timeout=60)
        assert coord.returncode == 0, out.decode()


@pytest.mark.parametrize("kind", ["npz", "csv"])
def test_user_data_trains_cold_then_warm(tmp_path: Path, kind: str) -> None:
    job, cache = _job(tmp_path, kind), tmp_path / "cache"
    cold = _run_job(job, cache, free_port())
    assert cold["finished"]["reason"] == "target_accuracy"
    assert cold["finished"]["accuracy"] >= TARGET
    data = cold["data"]
    assert data["shards"] == 4 and data["ws_fetches"] >= 1
    assert 0 < data["ws_bytes"] <= 2 * data["shard_bytes"]  # each client fetched each once
    assert len(list(cache.glob("*.shard"))) >= 1
    if kind == "csv":
        return  # the warm run is the same for both kinds
    warm = _run_job(job, cache, free_port())
    assert warm["finished"]["reason"] == "target_accuracy"
    assert warm["data"]["ws_fetches"] == 0 and warm["data"]["ws_bytes"] == 0


def test_a_bad_data_file_is_an_error_before_the_join_url(tmp_path: Path) -> None:
    np.savez(tmp_path / "train.npz", X=np.ones((10, 5)), y=np.arange(10) % 3)
    (tmp_path / "job.toml").write_text(
        '[model]\nwidths = [20, 32, 3]\n[data]\npath = "train.npz"\n'
    )
    cmd = [sys.executable, "-m", "crowdgrad", "coordinator", "--job", str(tmp_path / "job.toml")]
    res = subprocess.run(
        [*cmd, "--port", "0"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert res.returncode != 0
    out = res.stdout + res.stderr
    assert "5 features, the model's input width is 20" in out
    assert "join with" not in out and "Traceback" not in out


def test_shards_by_http_are_immutable_and_take_ranges() -> None:
    with running(digits_job()) as (bg, service, _), httpx.Client(base_url=bg.http) as http:
        assert http.get("/healthz").status_code == 200
        assert service.core is not None
        shard = service.core.data.shards[0]
        r = http.get(f"/data/{shard.sha256}")
        assert r.status_code == 200 and r.content == shard.blob
        assert r.headers["etag"] == f'"{shard.sha256}"'
        assert "immutable" in r.headers["cache-control"]
        assert r.headers["access-control-allow-origin"] == "*"  # pages on other origins
        r = http.get(f"/data/{shard.sha256}", headers={"Range": "bytes=10-19"})
        assert r.status_code == 206 and r.content == shard.blob[10:20]
        assert r.headers["content-range"] == f"bytes 10-19/{len(shard.blob)}"
        r = http.get(f"/data/{shard.sha256}", headers={"Range": "bytes=-5"})
        assert r.status_code == 206 and r.content == shard.blob[-5:]
        r = http.get(f"/data/{shard.sha256}", headers={"Range": f"bytes={len(shard.blob)}-"})
        assert r.status_code == 416
        r = http.get(f"/data/{shard.sha256}", headers={"If-None-Match": f'"{shard.sha256}"'})
        assert r.status_code == 304 and r.content == b""
        r = http.head(f"/data/{shard.sha256}")
        assert r.status_code == 200 and int(r.headers["content-length"]) == len(shard.blob)
        assert http.get("/data/" + "0" * 64).status_code == 404
        st = http.get("/api/status").json()["data"]
        assert st["http_fetches"] == 3 and st["http_bytes"] == len(shard.blob) + 15
