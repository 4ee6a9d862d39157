"""benchmarks/simulations.py's equal-loss columns on a tiny teacher job: each
anchor is the fastest of its learning rates, a diverging rate is skipped, and the
crowd's time to a loss is the first sample at or below it. (The measured table
is a benchmark, not a test.)"""

from __future__ import annotations

from types import ModuleType, SimpleNamespace

import pytest

from simulations.driver import Simulation
from simulations.linear import linear_evaluations
from simulations.scenario import parse_scenario
from tests.bench_module import load_benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("simulations")


def tiny_sim(bench: ModuleType) -> Simulation:
    raw = bench._large("lan", None, steps=40)
    raw["job"]["model"]["preset"] = "tiny"
    raw["job"]["data"]["dataset"] = "teacher:tiny"
    return Simulation(parse_scenario(raw))


def first_hit(sim: Simulation, lr: float, batch: int, target: float, steps: int) -> int | None:
    for done, r in linear_evaluations(
        sim.job, sim.dataset, max_steps=steps, lr=lr, batch=batch, every=1
    ):
        if not r.loss < 1e6:
            return None
        if r.loss <= target:
            return done
    return None


def test_anchors_take_the_fastest_rate_and_skip_a_diverging_one(bench, monkeypatch) -> None:
    sim = tiny_sim(bench)
    curve = [float(r.loss) for _, r in linear_evaluations(sim.job, sim.dataset, max_steps=40)]
    targets = (curve[0] * 0.9, curve[-1] * 1.05)  # reached within the steps allowed
    monkeypatch.setattr(bench, "TARGETS", targets)
    monkeypatch.setattr(bench, "ANCHOR_LRS", (0.003, 0.01, 1e4))  # 1e4 diverges
    a = bench.anchors(sim, max_steps=400)
    step_s = a["step_s"]
    for t in targets:
        hits = {lr: first_hit(sim, lr, 16, t, 400) for lr in (0.003, 0.01)}
        assert first_hit(sim, 1e4, 16, t, 400) is None
        best_lr = min((lr for lr in hits if hits[lr] is not None), key=lambda lr: hits[lr])
        single = a["single"][str(t)]
        assert single["lr"] == best_lr and single["steps"] == hits[best_lr]
        assert single["seconds"] == pytest.approx(single["steps"] * step_s)
        parallel = a["data_parallel"][str(t)]
        assert parallel["steps"] == min(
            s for lr in (0.003, 0.01) if (s := first_hit(sim, lr, 8 * 16, t, 100)) is not None
        )
        speedup = a["data_parallel_speedup"][str(t)]
        assert speedup == pytest.approx(single["seconds"] / parallel["seconds"])


def test_the_crowds_time_to_a_loss_is_its_first_sample_at_or_below_it(bench, monkeypatch) -> None:
    monkeypatch.setattr(bench, "TARGETS", (0.5, 0.1))
    anchor = {"single": {"0.5": {"seconds": 30.0}, "0.1": {"seconds": 60.0}}}
    series = [
        SimpleNamespace(t=t, loss=loss)
        for t, loss in [(0.0, None), (5.0, 0.9), (10.0, 0.5), (15.0, 0.7), (20.0, 0.2)]
    ]
    out = bench.equal_loss(series, anchor)["at_equal_loss"]
    assert out["0.5"] == {"crowd_s": 10.0, "single_s": 30.0, "speedup": 3.0}
    assert out["0.1"] == {"crowd_s": None, "single_s": 60.0, "speedup": None}


def test_the_defaults_rows_leave_the_strategy_and_lease_to_the_job(bench) -> None:
    """What an operator gets: no strategy or lease table, a run of fixed virtual time."""
    raw = bench._large("roblox", None, 0, strategy=bench.DEFAULTS)
    assert raw["job"]["strategy"] == {} and raw["job"]["lease"] == {}
    assert raw["run"]["max_virtual_s"] == bench.DEFAULTS_VIRTUAL_S and "max_steps" not in raw["run"]
    sc = parse_scenario(raw)
    assert sc.job.strategy.tau == "auto"
    seeded = bench._large("roblox", None, 100)
    assert seeded["job"]["strategy"]["tau"] == 10 and seeded["run"]["max_steps"] == 100
