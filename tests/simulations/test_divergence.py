"""A job whose lr makes training diverge finds a lower one (strategies/divergence.py),
in the simulator with the real coordinator and client sessions, at crowd sizes 1 to 16:
every task would otherwise come back non-finite and be declined for ever."""

from __future__ import annotations

import math

import pytest

from nn.train import evaluate
from simulations.driver import Simulation
from simulations.scenario import parse_scenario


def teacher(lr: float, players: int) -> Simulation:
    """The medium preset's teacher (an MSE regression), where one machine's SGD
    at batch 16 goes non-finite somewhere under lr 2."""
    return Simulation(
        parse_scenario(
            {
                "name": "diverging-lr",
                "seed": 1,
                "job": {
                    "model": {"preset": "medium", "loss": "mse"},
                    "data": {"dataset": "teacher:medium", "shards": 4, "batch": 16},
                    "strategy": {"name": "decentral-async", "lr": lr},
                    "link": {"profile": "lan"},
                    "stop": {"max_time_s": 30},
                    "eval": {"every_versions": 5},
                },
                "clients": {"count": players, "compute": 1e8, "latency": 0.01},
                "run": {"mode": "numeric"},
            }
        )
    )


@pytest.mark.parametrize("players", [1, 4, 16])
def test_a_diverging_lr_is_cut_until_the_crowd_trains(players: int) -> None:
    sim = teacher(2.0, players)
    held_out = sim.core.evaluator
    start = evaluate(sim.core.params, held_out.X, held_out.y).loss
    result = sim.run()
    loss = result.summary["loss"]
    assert result.summary["versions"] > 5
    assert loss is not None and math.isfinite(loss)
    assert loss < 0.1 * start, (loss, start)
    guard = sim.core.strategy.divergence
    assert guard.cuts >= 1 and guard.cap <= 0.5


def test_an_lr_that_trains_is_never_cut() -> None:
    sim = teacher(0.05, 4)
    result = sim.run()
    assert sim.core.strategy.divergence.cuts == 0
    assert result.summary["loss"] < 0.1
