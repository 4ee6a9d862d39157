"""simulations.federation: edges with their crowds and a root, on one virtual clock.

The small shipped scenario (2 edges x 4 players) runs in about a second: the
root, which never trains, reaches its target from the edges' syncs alone; the
run is deterministic; the crowd is the single-coordinator run's crowd; and the
empty syncs of edges whose crowds have not trained yet no longer make the root
refuse every later sync (coordinator.core.validation)."""

from __future__ import annotations

from typing import Any

import pytest

from nn.data import load_dataset
from simulations.driver import Simulation
from simulations.federation import Federation, run_federation
from simulations.report import write_report
from simulations.runner import run_scenario
from simulations.scenario import ScenarioError, load_raw, parse_scenario, resolve

SMOKE = "federation-smoke"


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def smoke(**changes: Any) -> dict[str, Any]:
    """The shipped small federation as raw data, with dotted-path ``changes``."""
    data = load_raw(resolve(SMOKE))
    for dotted, value in changes.items():
        node = data
        *parents, key = dotted.split("__")
        for k in parents:
            node = node.setdefault(k, {})
        node[key] = value
    return data


def test_the_root_reaches_its_target_from_both_edges_syncs(digits):
    sc = parse_scenario(smoke())
    s = run_federation(sc, dataset=digits).summary
    assert s["reason"] == "target_accuracy"
    assert s["accuracy"] >= sc.job.stop.target_accuracy
    assert 0 < s["time_to_target"] == s["seconds"] < 60
    assert s["edges"] == 2 and len(s["per_edge"]) == 2
    for edge in s["per_edge"]:
        assert edge["players"] == 4 and edge["syncs"] >= 2 and edge["steps"] > 0
        assert edge["bytes_to_root"] > 0 and edge["bytes_from_root"] > 0
    assert s["syncs_accepted"] >= 4 and s["syncs_rejected"] == 0
    # the root's traffic is the uplinks', and it is a small part of everything moved
    assert s["root_bytes_in"] == sum(e["bytes_to_root"] for e in s["per_edge"])
    assert s["root_bytes_out"] == sum(e["bytes_from_root"] for e in s["per_edge"])
    crowd = sum(e["crowd_bytes_up"] + e["crowd_bytes_down"] for e in s["per_edge"])
    assert s["bytes_up"] + s["bytes_down"] == crowd + s["root_bytes_in"] + s["root_bytes_out"]
    assert s["root_bytes_in"] + s["root_bytes_out"] < crowd / 5
    assert 0 < s["root_steps"] <= s["steps"]


def test_same_seed_gives_byte_identical_results(tmp_path, digits):
    runs = [
        run_federation(parse_scenario(smoke(seed=seed)), label="fed", dataset=digits)
        for seed in (5, 5, 6)
    ]
    for name, run in zip("abc", runs, strict=True):
        write_report([run], tmp_path / name, plots=False)
    a, b, c = ((tmp_path / n / "results.json").read_bytes() for n in "abc")
    assert a == b and a != c
    assert (tmp_path / "a" / "timeseries.csv").read_bytes() == (
        tmp_path / "b" / "timeseries.csv"
    ).read_bytes()


def test_empty_syncs_before_the_crowd_trains_do_not_stop_the_root(digits):
    # Players join over 6 s and the edges sync every second: the first syncs are
    # empty. Their zero norms made the root's median zero, and it refused every
    # later sync for its norm (571 refused, the target never met); zero norms no
    # longer count (coordinator.core.validation).
    sc = parse_scenario(smoke(clients__join_over_s=6.0, federation__every_s=1.0))
    s = run_federation(sc, dataset=digits).summary
    assert s["syncs_rejected"] == 0
    assert s["reason"] == "target_accuracy"


def test_edges_serve_the_single_runs_players_and_run_scenario_routes(digits):
    fed = Federation(parse_scenario(smoke()), dataset=digits)
    single = Simulation(parse_scenario(smoke(federation__enabled=False)), dataset=digits)
    assert [p.index for p in fed.edges[0].players] == [0, 2, 4, 6]
    assert [p.index for p in fed.edges[1].players] == [1, 3, 5, 7]
    flops = {p.index: p.flops for e in fed.edges for p in e.players}
    assert flops == {p.index: p.flops for p in single.players}
    assert len({e.core.seed for e in fed.edges} | {fed.root.core.seed}) == 3
    assert [u.CONN for u in fed.uplinks] == ["e", "e"]
    # the root's link is the federation's profile; the players' the job's
    assert fed.root.limits.bytes_per_s > 100 * fed.edges[0].limits.bytes_per_s
    assert run_scenario(parse_scenario(smoke(run__max_virtual_s=1.0))).summary["edges"] == 2


def test_enabled_false_is_the_same_crowd_on_one_coordinator():
    on, off = parse_scenario(smoke()), parse_scenario(smoke(federation__enabled=False))
    assert on.federation is not None and off.federation is None
    assert off.job == on.job and off.clients == on.clients
    assert "federation" in on.to_dict() and "federation" not in off.to_dict()
    root = on.federation.root
    assert root.strategy.aggregation == "fedbuff" and root.link.profile == "lan"
    assert root.model == on.job.model and root.stop == on.job.stop


@pytest.mark.parametrize(
    ("changes", "path", "words"),
    [
        ({"federation__edges": 9}, "federation.edges", "9 edges for 8 players"),
        ({"federation__edges": 0}, "federation.edges", "greater than or equal to 1"),
        ({"federation__every_s": 200.0}, "federation.every_s", "lease.min_s (120 s)"),
        ({"federation__link": "carrier-pigeon"}, "federation.link", "unknown profile"),
        ({"federation__root__link": {"profile": "lan"}}, "federation.root.link", "federation.link"),
        ({"federation__root__strategy__buffer_k": 0}, "federation.root.strategy.buffer_k", ""),
        ({"federation__root__model": {"widths": [64, 10]}}, "federation.root.model", "share"),
        ({"federation__root__strategy__name": "central-async"}, "federation.root.strategy.name",
         "decentral"),
        ({"federation__enabled": "yes"}, "federation.enabled", "true or false"),
        ({"run__mode": "cost"}, "run.mode", "numeric"),
        ({"run__max_steps": 100}, "run.max_steps", "root's [job] stop"),
    ],
)  # fmt: skip
def test_a_bad_federation_is_reported_with_its_path(changes, path, words):
    with pytest.raises(ScenarioError) as info:
        parse_scenario(smoke(**changes), source="fed.toml")
    errors = dict(info.value.errors)
    assert path in errors, info.value.errors
    assert words in errors[path]


def test_an_invalid_job_is_reported_once():
    with pytest.raises(ScenarioError) as info:
        parse_scenario(smoke(job__strategy__tau=0))
    assert [p for p, _ in info.value.errors] == ["job.strategy.tau"]
