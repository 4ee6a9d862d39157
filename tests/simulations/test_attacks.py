"""Byzantine behaviours lie exactly as documented, and a scenario mixes them in."""

from __future__ import annotations

import numpy as np
import pytest

from client.compute import run_task
from nn.data import load_dataset
from nn.spec import ModelSpec
from protocol import messages as m
from simulations.attacks import ATTACKS, Attacker, AttackSpec
from simulations.driver import Simulation
from simulations.scenario import ScenarioError, parse_scenario

SPEC = ModelSpec(widths=(64, 16, 10))


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def _task(seed: int = 5) -> m.Task:
    return m.Task(
        task_id="7", model_version=0, spec=SPEC, dataset="digits#0", base_version=0,
        indices=np.arange(200, dtype=np.uint32), steps=5, batch=8, seed=seed,
    )  # fmt: skip


def test_each_lie_is_the_documented_transform(digits) -> None:
    base = SPEC.init_params(0)
    honest = run_task(_task(), base, digits).update
    rng = np.random.default_rng(0)

    def lie(kind: str, **kw) -> np.ndarray:
        return (
            Attacker(AttackSpec(kind=kind, fraction=1.0, **kw), rng)
            .compute(_task(), base, digits)
            .update
        )

    np.testing.assert_array_equal(lie("sign_flip"), -honest)
    np.testing.assert_allclose(lie("scaled", scale=-10.0), -10.0 * honest, rtol=1e-6)
    assert not lie("free_rider").any()
    noise = lie("noise", noise=2.0)
    rms = np.sqrt(np.mean(honest.astype(np.float64) ** 2))
    assert 1.5 * rms < np.sqrt(np.mean(noise.astype(np.float64) ** 2)) < 2.5 * rms
    other = run_task(_task(seed=5 ^ 1), base, digits).update
    np.testing.assert_allclose(
        lie("alie", z=1.0), (honest + other) / 2 - np.abs(honest - other) / 2, atol=1e-7
    )
    flipped = lie("label_flip")
    assert np.linalg.norm(flipped - honest) > 0.1 * np.linalg.norm(honest)
    np.testing.assert_array_equal(lie("hijack"), honest)  # the forgery is the driver's
    stale = Attacker(AttackSpec(kind="stale", fraction=1.0), rng)
    first = stale.compute(_task(1), base, digits).update
    np.testing.assert_array_equal(stale.compute(_task(2), base, digits).update, first)


def test_byzantine_share_is_seeded_and_sized() -> None:
    spec = AttackSpec(kind="sign_flip", fraction=0.2)
    a = spec.byzantine(64, np.random.default_rng(3))
    assert len(a) == 13 and a == spec.byzantine(64, np.random.default_rng(3))
    assert not AttackSpec(kind="noise", fraction=0.0).byzantine(64, np.random.default_rng(3))
    with pytest.raises(ValueError, match=r"attack\.kind"):
        AttackSpec(kind="nice", fraction=0.1)


def _scenario(kind: str | None, fraction: float = 0.25) -> dict:
    d = {
        "name": "att", "seed": 2,
        "job": {"model": {"widths": [64, 32, 10]}, "data": {"shards": 4},
                "strategy": {"name": "decentral-async", "tau": 10, "lr": 0.1},
                "link": {"profile": "roblox"}, "stop": {"target_accuracy": None, "max_time_s": 8},
                "eval": {"every_versions": 10}},
        "clients": {"count": 8, "compute": {"kind": "uniform", "low": 2e9, "high": 8e9}},
    }  # fmt: skip
    if kind is not None:
        d["clients"]["attack"] = {"kind": kind, "fraction": fraction}
    return d


def test_a_scenario_mixes_byzantine_players_in(digits) -> None:
    sim = Simulation(parse_scenario(_scenario("hijack")), dataset=digits)
    r = sim.run()
    assert r.summary["byzantine"] == 2
    assert sum(p.attacker is not None for p in sim.players) == 2
    assert r.summary["hijacks_sent"] > 0
    assert r.scenario["clients"]["attack"]["kind"] == "hijack"
    with pytest.raises(ScenarioError, match=r"clients\.attack\.kind"):
        parse_scenario(_scenario("polite"))


@pytest.mark.parametrize("kind", ATTACKS)
def test_every_attack_runs_in_a_scenario(kind: str, digits) -> None:
    r = Simulation(parse_scenario(_scenario(kind)), dataset=digits).run()
    assert r.summary["results_accepted"] > 0 and r.summary["byzantine"] == 2


def test_replication_excludes_sign_flippers_and_no_honest_player(digits) -> None:
    """A sign flip passes every norm check; a twin of its task shows it up."""
    d = _scenario("sign_flip")
    d["job"]["replication"] = {"enabled": True}
    r = Simulation(parse_scenario(d), dataset=digits).run()
    s = r.summary
    assert s["byzantine"] == 2 and s["replication_excluded"] == 2
    assert s["honest_closes"] == 0 and s["replication_agreed"] > 0
    assert s["replica_steps"] > 0 and 0 < s["replication_overhead"] < 0.5


@pytest.mark.parametrize("kind", ["sign_flip", "free_rider"])
def test_with_replication_liars_and_free_riders_end_with_no_credit(kind: str, digits) -> None:
    """Issue 36: credit counts checked work only, and a proven liar forfeits all."""
    d = _scenario(kind)
    d["job"]["replication"] = {"enabled": True}
    d["clients"]["volunteers"] = True
    s = Simulation(parse_scenario(d), dataset=digits).run().summary
    assert s["byzantine"] == 2 and s["replication_excluded"] == 2
    assert s["credit_byzantine_flops"] == 0 and s["credit_byzantine_pending"] == 0
    assert s["credit_honest_flops"] > 0
