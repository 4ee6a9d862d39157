"""The slow-link codecs in the simulator: roblox players move int8 down and int4 up,
and get there sooner."""

from __future__ import annotations

import pytest

from nn.data import load_dataset
from simulations.driver import Simulation
from tests.simulations.test_driver import small


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def test_roblox_players_on_int8_reach_the_target_sooner_on_fewer_bytes(digits):
    """4 roblox players on digits, to 0.9: the default (``codecs.slow_link`` auto:
    int8 models and int4-sr updates on these links) against every transfer in
    fp32. Per seed (3-5) about half the bytes a result and a third sooner (3.6-3.7
    s against 5.5-5.9 s when measured; with int8 updates it was 3.7-4.4 s)."""
    for seed in (3, 4, 5):
        runs = {}
        for slow_link in ("auto", "off"):
            sc = small(seed=seed, target=0.9)
            sc = sc.model_copy(update={"job": sc.job.replace(codecs={"slow_link": slow_link})})
            runs[slow_link] = s = Simulation(sc, dataset=digits).run().summary
            assert s["reason"] == "target_accuracy"
        per_result = {
            k: (s["bytes_up"] + s["bytes_down"]) / s["results_accepted"] for k, s in runs.items()
        }
        assert per_result["auto"] < per_result["off"] / 1.6
        assert runs["auto"]["time_to_target"] < runs["off"]["time_to_target"]
