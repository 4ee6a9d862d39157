"""Sweeps on Ray give the sequential run's results byte for byte (a real local Ray
of 2 CPUs; CI installs the ``ray`` extra, so with CROWDGRAD_REQUIRE_ALL this
cannot skip)."""

from __future__ import annotations

from pathlib import Path

import pytest

from crowdgrad.cli import main

SCENARIO = """
name = "sweep-test"
description = "four seeds of a small digits crowd"
seed = 3
[job]
model = { widths = [64, 32, 10] }
data = { dataset = "digits", shards = 4, batch = 16 }
strategy = { name = "decentral-async", tau = 10, lr = 0.1 }
link = { profile = "roblox" }
stop = { target_accuracy = 0.85, max_time_s = 600 }
eval = { every_versions = 2 }
[clients]
count = 4
compute = { kind = "uniform", low = 2e9, high = 8e9 }
latency = { kind = "uniform", low = 0.02, high = 0.1 }
[run]
mode = "numeric"
[sweep]
"seed" = [1, 2, 3, 4]
"""


def test_a_sweep_on_ray_matches_the_sequential_run_byte_for_byte(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    sc = tmp_path / "sweep.toml"
    sc.write_text(SCENARIO)
    common = ["simulate", str(sc), "--sweep", "--no-plots", "--quiet", "-o"]
    assert main([*common, str(tmp_path / "seq")]) == 0
    assert main([*common, str(tmp_path / "ray"), "--ray", "--ray-cpus", "2"]) == 0
    for name in ("results.json", "timeseries.csv", "summary.md"):
        seq = (tmp_path / "seq" / name).read_bytes()
        assert seq == (tmp_path / "ray" / name).read_bytes(), name
    assert seq.count(b"seed=") >= 4  # four points, not one


def test_ray_options_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sc = tmp_path / "sweep.toml"
    sc.write_text(SCENARIO)
    args = ["simulate", str(sc), "--sweep", "--quiet", "-o", str(tmp_path / "o")]
    assert main([*args, "--ray", "--ray-cpus", "0"]) != 0
    assert "--ray-cpus: expected an integer >= 1, got 0" in capsys.readouterr().err
    assert main([*args, "--ray", "ray://example:10001", "--ray-cpus", "2"]) != 0
    assert "--ray-cpus sizes a local Ray" in capsys.readouterr().err
