"""benchmarks/compression.py on tiny runs: its byte counts are every frame the
loopback carried for the tasks, and its rows state down, up, total and the goal
consistently. (The measured table is a benchmark, not a test.)"""

from __future__ import annotations

import argparse
import json
from types import ModuleType

import pytest

from tests.bench_module import load_benchmark

TINY = ["--updates", "40", "--clients", "4", "--widths", "64,16,10", "--seeds", "1"]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("compression")


def tiny_args() -> argparse.Namespace:
    ns = argparse.Namespace(tau=10, batch=16, lr=0.1, alpha=0.6, window="1")
    ns.updates, ns.clients, ns.widths = 40, 4, "64,16,10"
    return ns


@pytest.mark.parametrize(
    "delta", [None, ("fp16", 2, 16)], ids=["full downloads", "fp16 deltas, chain 2"]
)
def test_event_bytes_are_the_frames_the_loopback_carried(bench, delta) -> None:
    cfg = bench.Config("top-k", "topk:0.01+int8", True, *(delta or ()))
    r = bench.run_one(cfg, seed=0, args=tiny_args())
    wire = r["carried"]
    assert r["down_task"] == wire["down:task"] > 0  # the task frames themselves
    assert r["down_model"] == wire["down:chunk"] > 0  # model or delta chunks
    assert r["down_data"] == wire["down:data"] > 0  # shard data, once per client and shard
    assert r["up"] == wire["up:result"] + wire["up:chunk"] > 0
    # the rest of the wire is control traffic: hello, welcome, acks, fetch, bye
    control = r["wire_down"] + r["wire_up"] - r["down_task"] - r["down_model"]
    control -= r["down_data"] + r["up"]
    assert 0 < control < r["up"]
    assert r["accepted"] == 40
    if delta is None:
        assert r["downloads"]["delta"] == 0 and r["drift"] is None
    else:
        assert r["downloads"]["delta"] > r["downloads"]["full"] > 0
        assert r["drift"] is not None and 0 < r["drift"] < 1e-2  # fp16: lossy, bounded


def test_rows_state_down_up_total_and_the_goal_on_the_total(bench, capsys) -> None:
    only = "fp32,top-k 1% + int8 + EF"
    assert (
        bench.main([*TINY, "--json", "--rows", "upload,delta", "--delta", "fp16", "--only", only])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    rows = report["rows"]
    assert [(r["config"], r["delta"]) for r in rows] == [
        ("fp32", None),
        ("top-k 1% + int8 + EF", None),
        ("fp32", "fp16"),
        ("top-k 1% + int8 + EF", "fp16"),
    ]
    base = rows[0]
    assert base["total_reduction"] == base["upload_reduction"] == 1.0
    for r in rows:
        assert r["total_bytes"] == pytest.approx(r["down_bytes"] + r["up_bytes"])
        assert r["steady_total_bytes"] == pytest.approx(
            r["steady_down_bytes"] + r["steady_up_bytes"]
        )
        parts = r["down_task_bytes"] + r["down_model_bytes"] + r["down_data_bytes"]
        assert r["down_bytes"] == pytest.approx(parts)
        assert r["total_reduction"] == pytest.approx(
            base["steady_total_bytes"] / r["steady_total_bytes"]
        )
        ok = r["accuracy_loss_points"] <= 0.5
        assert r["meets_goal"] == (ok and r["total_reduction"] >= 16)
        assert r["tasks_per_client"] == 10
    sparse_full, sparse_delta = rows[1], rows[3]
    # top-k uploads: the upload-only ratio overstates what a task costs
    assert sparse_full["upload_reduction"] > 10 > 2 > sparse_full["total_reduction"]
    # fp16 deltas take the download down by close to half
    assert sparse_delta["down_model_bytes"] < 0.7 * sparse_full["down_model_bytes"]
