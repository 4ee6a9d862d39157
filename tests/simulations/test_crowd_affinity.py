"""A crowd larger than its job's shards keeps the shards it holds: on roblox
links a fetch costs more than a task computes, so each player should fetch
about one shard, not one per task (ShardCursor's ``lead``)."""

from __future__ import annotations

from coordinator.core import events as ev
from simulations.driver import Simulation
from simulations.scenario import parse_scenario

PLAYERS, SHARDS = 24, 4


def _served_bytes(players: int) -> tuple[int, int, int]:
    raw = {
        "name": "more-players-than-shards",
        "seed": 3,
        "job": {
            "model": {"widths": [64, 32, 10]},
            "data": {"dataset": "classify:4000", "batch": 16, "shards": SHARDS},
            "link": {"profile": "roblox"},
            "stop": {"max_time_s": 40.0, "patience": 0},
            "eval": {"every_versions": 50, "max_samples": 500},
        },
        "clients": {"count": players, "compute": 2.4e8, "latency": 0.05},
        "run": {"mode": "numeric", "sample_every_s": 5.0},
    }
    served: list[ev.DataServed] = []

    def observe(_sim: Simulation, outputs: list[ev.Output]) -> None:
        served.extend(o for o in outputs if isinstance(o, ev.DataServed))

    sim = Simulation(parse_scenario(raw), observer=observe)
    report = sim.run()
    shard_bytes = sim.core.data.total_bytes // SHARDS
    return sum(s.nbytes for s in served), shard_bytes, report.summary["results_accepted"]


def test_each_player_of_a_crowd_larger_than_the_shards_fetches_about_one_shard() -> None:
    """24 players on 4 shards for 40 virtual s: with one cycle of affinity they
    fetched 92 shards (5.2 s of a 260-kB shard on the link each) and returned
    2,972 results; with a lead of the crowd over the shards each fetched its
    first and kept it: 24 shards, 5,040 results."""
    served, shard, results = _served_bytes(PLAYERS)
    assert results > 10 * PLAYERS, results  # long enough that refetching would show
    assert served <= 1.25 * PLAYERS * shard, (served / shard, results)
