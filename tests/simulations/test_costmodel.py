import pytest

from simulations.costmodel import CHUNK_OVERHEAD, RESULT_BYTES, TASK_BYTES, CostSimulation
from simulations.scenario import parse_scenario


def scenario(strategy="decentral-async", count=1, **clients):
    return parse_scenario(
        {
            "seed": 2,
            "job": {
                "model": {"widths": [10, 100, 10], "loss": "mse"},
                "data": {"dataset": "teacher:tiny", "batch": 16},
                "strategy": {"name": strategy, "tau": 10},
                "link": {"profile": "roblox"},
                "stop": {"max_time_s": 10_000},
            },
            "clients": {"count": count, "compute": 1e9, "latency": 0.0, **clients},
            "server": {"compute": 1e9},
            "run": {"mode": "cost", "max_steps": 20},
        }
    )


def test_one_client_timing_is_exact():
    sc = scenario()
    sim = CostSimulation(sc)
    r = sim.run()
    params = 10 * 100 + 100 + 100 * 10 + 10
    blob = params * 4 + CHUNK_OVERHEAD  # one frame under roblox's 16 MiB
    assert sim.frames == [blob]
    compute = 6 * (10 * 100 + 100 * 10) * 16 * 10 / 1e9
    bw = 50_000.0
    # each task: task frame + model down (the server stepped since), compute, result +
    # update up
    first = (TASK_BYTES + blob) / bw + compute + (RESULT_BYTES + blob) / bw
    second = first
    assert r.summary["reason"] == "max_steps" and r.summary["steps"] == 20
    assert r.summary["seconds"] == pytest.approx(first + second)
    assert r.summary["linear_seconds"] == pytest.approx(compute * 2)


@pytest.mark.parametrize("strategy", ["central-sync", "central-async", "decentral-sync"])
def test_every_strategy_finishes(strategy):
    r = CostSimulation(scenario(strategy, count=4)).run()
    assert r.summary["reason"] == "max_steps"
    assert r.summary["accuracy"] is None


def test_churn_is_survived_and_deterministic():
    churn = {"churn": {"session": {"kind": "exponential", "mean": 0.3}, "rejoin": 0.2}}
    a = CostSimulation(scenario(count=6, **churn)).run()
    b = CostSimulation(scenario(count=6, **churn)).run()
    assert a.summary == b.summary
    assert a.summary["drops"] > 0 and a.summary["reason"] == "max_steps"
