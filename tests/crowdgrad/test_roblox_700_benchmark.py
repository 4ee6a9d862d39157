"""benchmarks/roblox_700.py, run small: its scenario is a valid one of 700 roblox
players on the generated job, and each anchor is timed at its best lr per threshold."""

from __future__ import annotations

import pytest

from nn.data import classification_task
from simulations.scenario import parse_scenario
from tests.bench_module import load_benchmark

bench = load_benchmark("roblox_700")


def test_the_scenario_is_700_players_on_roblox_links_at_the_machines_rate() -> None:
    sc = parse_scenario(bench.scenario(60.0, 2.4e8, 64, 20))
    assert sc.clients.count == 700 and sc.job.link.profile == "roblox"
    assert sc.job.data.shards == 64 and sc.job.stop.max_time_s == 60.0
    assert sc.job.strategy.tau == "auto"  # the job's defaults: nothing tuned
    assert sc.server.compute == 2.4e8
    small = parse_scenario(bench.scenario(60.0, 2.4e8, 64, 20, players=8))
    assert small.clients.count == 8 and small.name == "generated-8-roblox"
    # --rounds: the tuned DiLoCo rounds, evaluated every round
    rounds = parse_scenario(bench.scenario(60.0, 2.4e8, 128, 20, rounds=True))
    st = rounds.job.strategy
    assert (st.name, st.outer_optimizer, st.outer_lr, st.tau) == (
        "decentral-sync",
        "nesterov",
        "auto",
        104,
    )
    assert rounds.job.eval.every_versions == 1 and rounds.job.data.shards == 128
    assert parse_scenario(bench.scenario(60.0, 2.4e8, 64, 20, seed=2)).seed == 2


def test_each_threshold_takes_the_lr_that_reached_it_in_the_fewest_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bench, "THRESHOLDS", (0.2, 0.3))
    ds = classification_task(3000, seed=0)
    out = bench.one_model(ds, [0.01, 0.1], 1, 600, 50, step_s=0.5)
    for t, best in out["best"].items():
        hits = [r["steps_to"][t] for r in out["runs"] if r["steps_to"][t]]
        if not hits:
            assert best is None
            continue
        assert best["steps"] == min(hits) and best["seconds"] == best["steps"] * 0.5
    assert out["best"]["0.2"] is not None  # a 10-class problem passes 20 % in 600 steps
