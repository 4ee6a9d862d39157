import json
from collections import Counter

import numpy as np
import pytest

from coordinator.core import events as ev
from coordinator.core.leases import TaskState
from nn.data import load_dataset
from simulations.driver import Simulation
from simulations.linear import linear_evaluations
from simulations.report import write_report
from simulations.scenario import parse_scenario

STRATEGIES = ["central-sync", "central-async", "decentral-sync", "decentral-async"]


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def small(strategy="decentral-async", *, seed=3, target=0.8, **clients):
    return parse_scenario(
        {
            "name": "small",
            "seed": seed,
            "job": {
                "model": {"widths": [64, 32, 10]},
                "data": {"dataset": "digits", "shards": 4, "batch": 16},
                "strategy": {"name": strategy, "tau": 10, "lr": 0.1},
                "link": {"profile": "roblox"},
                "stop": {"target_accuracy": target, "max_time_s": 300},
                "eval": {"every_versions": 2},
            },
            "clients": {
                "count": 4,
                "compute": {"kind": "uniform", "low": 2e9, "high": 8e9},
                "latency": {"kind": "uniform", "low": 0.02, "high": 0.1},
                **clients,
            },
        }
    )


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_strategy_reaches_its_target(strategy, digits):
    r = Simulation(small(strategy), dataset=digits).run()
    s = r.summary
    assert s["reason"] == "target_accuracy"
    assert s["accuracy"] >= 0.8
    assert 0 < s["time_to_target"] == s["seconds"] <= 300
    assert s["results_accepted"] > 0 and s["bytes_up"] > 0 and s["bytes_down"] > 0
    assert r.series[0].t == 0.0 and r.series[-1].accuracy == s["accuracy"]


def test_same_seed_gives_byte_identical_results_json(tmp_path, digits):
    churny = {"churn": {"drop_per_minute": 0.9, "rejoin": {"kind": "exponential", "mean": 2}}}
    # to 0.9: long enough for the seeded churn to drop a player (seed 7 drops two;
    # with shard affinity, seed 5 reaches 0.9 before any drop)
    a = Simulation(small(seed=7, target=0.9, **churny), dataset=digits).run()
    b = Simulation(small(seed=7, target=0.9, **churny), dataset=digits).run()
    c = Simulation(small(seed=8, target=0.9, **churny), dataset=digits).run()
    write_report([a], tmp_path / "a", plots=False)
    write_report([b], tmp_path / "b", plots=False)
    write_report([c], tmp_path / "c", plots=False)
    ja = (tmp_path / "a" / "results.json").read_bytes()
    assert ja == (tmp_path / "b" / "results.json").read_bytes()
    assert (tmp_path / "a" / "timeseries.csv").read_bytes() == (
        tmp_path / "b" / "timeseries.csv"
    ).read_bytes()
    assert ja != (tmp_path / "c" / "results.json").read_bytes()
    # seeded churn: these runs have drops (the same ones each time), and they are counted
    assert json.loads(ja)["runs"][0]["summary"]["drops"] > 0


def test_numerics_thread_changes_nothing_but_the_wall_clock(tmp_path, digits):
    """Tasks computed ahead on the numerics thread give the very same run."""
    churny = {"churn": {"drop_per_minute": 0.5, "rejoin": {"kind": "exponential", "mean": 2}}}
    a = Simulation(small(seed=5, **churny), dataset=digits, overlap=True).run()
    b = Simulation(small(seed=5, **churny), dataset=digits, overlap=False).run()
    write_report([a], tmp_path / "a", plots=False)
    write_report([b], tmp_path / "b", plots=False)
    ja = (tmp_path / "a" / "results.json").read_bytes()
    assert ja == (tmp_path / "b" / "results.json").read_bytes()
    assert json.loads(ja)["runs"][0]["summary"]["results_accepted"] > 0


def test_max_steps_stop_and_linear_baseline(digits):
    sc = small("decentral-async", target=0.99)
    sc = sc.model_copy(update={"run": sc.run.model_copy(update={"max_steps": 100})})
    r = Simulation(sc, dataset=digits).run()
    s = r.summary
    assert s["reason"] == "max_steps" and s["steps"] >= 100
    flops = sc.job.spec.flops_per_sample(train=True) * 16 * 100
    assert s["linear_seconds"] == pytest.approx(flops / sc.server.compute)
    assert s["speedup"] == pytest.approx(s["linear_seconds"] / s["virtual_seconds"])


def test_linear_anchor_takes_its_own_lr_batch_and_evaluation_cadence(digits):
    """The single machine runs at the settings it is given (an anchor at its own
    best lr; players × batch for the ideal synchronous crowd), seeded the same
    way each time; left alone it is the job's clients' numerics."""
    job = small().job

    def curve(**kw):
        return [(d, float(r.loss)) for d, r in linear_evaluations(job, digits, max_steps=20, **kw)]

    default = curve()
    assert [d for d, _ in default] == [10, 20] and default == curve(lr=0.1, batch=16)
    assert [d for d, _ in curve(every=5)] == [5, 10, 15, 20] == [d for d, _ in curve(every=5)]
    assert curve(every=5) == curve(every=5)
    assert curve(lr=0.3) != default and curve(batch=128) != default
    assert curve(batch=128) == curve(batch=128)


def test_linear_anchor_follows_the_jobs_schedule(digits):
    """One step is one version: a warm-up from half the lr (0.1) to all of it
    over 10 steps runs the first stretch (10 steps) at 0.05, the second at 0.1."""
    job = small().job
    ramp = {"kind": "warmup-cosine", "start": 0.5, "peak": 1.0, "end": 1.0, "versions": 10}
    warm = job.replace(strategy={"schedule": {**ramp, "warmup": 10}})

    def curve(j, **kw):
        return [(d, float(r.loss)) for d, r in linear_evaluations(j, digits, **kw)]

    got = curve(warm, max_steps=20)
    slow = curve(job, max_steps=10, lr=0.05)
    assert got[0] == slow[0] and got != curve(job, max_steps=20)
    assert got[0] != curve(job, max_steps=10)[0]


def test_players_take_delta_downloads_in_a_codec_of_their_own(digits):
    """A job whose delta codec is neither its model nor its update codec: the
    players offer it too, so later downloads are deltas (fp16: about half the
    bytes of the fp32 model; 57 % of the bytes here), not whole models. The
    whole models are fp32 here (``slow_link`` off: on these roblox links the
    job's codecs would otherwise be int8)."""

    def run(codecs):
        sc = small("decentral-async", target=0.99, warm_data=True)
        job = sc.job.model_copy(update={"codecs": sc.job.codecs.model_copy(update=codecs)})
        run = sc.run.model_copy(update={"max_steps": 400})
        return Simulation(sc.model_copy(update={"job": job, "run": run}), dataset=digits).run()

    whole, deltas = run({"slow_link": "off"}), run({"delta": "fp16"})
    assert deltas.summary["results_accepted"] == whole.summary["results_accepted"]
    assert deltas.summary["bytes_down"] < 0.8 * whole.summary["bytes_down"]


# -- the fault sweep -------------------------------------------------------------------


class Invariants:
    """The coordinator's promises, checked after every batch of outputs."""

    def __init__(self):
        self.accepted = Counter()
        self.version = 0
        self.updates = 0
        self.queued = 0  # checks that saw a queued (prefetched) lease

    def __call__(self, sim, outputs):
        core = sim.core
        for o in outputs:
            if isinstance(o, ev.ResultAccepted):
                self.accepted[o.task_id] += 1
                assert self.accepted[o.task_id] == 1, f"task {o.task_id} applied twice"
            elif isinstance(o, ev.ModelUpdated):
                assert o.version >= self.version, "version went backwards"
                self.version = o.version
                self.updates += 1
        live = core.book.leases_live()
        holders = Counter(lease.client_id for lease in live)
        for client_id, n in holders.items():
            queued = core.book.queued_lease_of(client_id)
            # One current lease, and one queued behind it only after a prefetch,
            # only under decentral-async.
            assert n == 1 + (queued is not None), f"{client_id} holds {n} live leases"
            assert queued is None or core.strategy.pipelined, "a prefetch in a sync strategy"
            self.queued += queued is not None
        if core.finished is None:
            assert all(lease.client_id in core.conns for lease in live), "lease of a gone client"
        assert core.params.is_finite()

    def final(self, sim):
        core = sim.core
        accepted = set(core.book.accepted_ids())  # those resolved in the last retain_s
        assert accepted <= set(self.accepted), "an accepted task that was never acknowledged"
        assert all(core.book.outcome(t) in (TaskState.ACCEPTED, None) for t in self.accepted)
        assert core.accepted_results == sum(self.accepted.values())
        assert core.version == self.version


def fault_scenario(i):
    rng = np.random.default_rng(1000 + i)
    strategy = STRATEGIES[i % 4]
    return parse_scenario(
        {
            "name": f"fault-{i}",
            "seed": i,
            "job": {
                "model": {"widths": [64, 8, 10]},
                "data": {"dataset": "digits", "shards": int(rng.integers(2, 6)), "batch": 8},
                "strategy": {
                    "name": strategy,
                    "tau": int(rng.integers(1, 6)),
                    "lr": 0.1,
                    "round_deadline_s": float(rng.uniform(1, 5)),
                },
                "link": {"profile": str(rng.choice(["roblox", "mobile", "lan"]))},
                "lease": {
                    "min_s": float(rng.uniform(0.5, 3)),
                    "heartbeat_interval_s": 1.0,
                    "heartbeat_timeout_s": float(rng.uniform(2, 5)),
                    "resume_grace_s": float(rng.uniform(0, 3)),
                    "prefetch": True,  # off by default; the sweep covers queued leases
                },
                "stop": {"max_time_s": float(rng.uniform(3, 8))},
                "eval": {"every_versions": 5},
            },
            "clients": {
                "count": int(rng.integers(1, 7)),
                "compute": {"kind": "lognormal", "median": 1e8, "sigma": 1.0},
                # latency spikes: a heavy right tail up to seconds
                "latency": {
                    "kind": "lognormal",
                    "median": 0.05,
                    "sigma": float(rng.uniform(0, 1.5)),
                },
                "churn": {
                    "session": {"kind": "exponential", "mean": float(rng.uniform(0.5, 8))},
                    "rejoin": {"kind": "exponential", "mean": float(rng.uniform(0.1, 3))},
                },
                "silent_drops": float(rng.uniform(0, 1)),
                "duplicate_results": float(rng.uniform(0, 0.5)),
                "join_over_s": float(rng.uniform(0, 2)),
            },
            "run": {"tick_every_s": 0.5, "sample_every_s": 5.0},
        }
    )


def test_fault_sweep_keeps_the_coordinators_invariants(digits):
    totals = Counter()
    for i in range(200):
        check = Invariants()
        sim = Simulation(fault_scenario(i), dataset=digits, observer=check)
        r = sim.run()
        check.final(sim)
        s = r.summary
        totals["drops"] += s["drops"]
        totals["frames_lost"] += s["frames_lost"]
        totals["rejected"] += s["results_rejected"]
        totals["expired"] += s["leases_expired"]
        totals["accepted"] += s["results_accepted"]
        totals["queued"] += check.queued
    # the sweep really exercised the faults it is about
    assert totals["drops"] > 100
    assert totals["frames_lost"] > 100
    assert totals["rejected"] > 10  # duplicates and stale results refused
    assert totals["expired"] > 0
    assert totals["accepted"] > 200
    assert totals["queued"] > 100  # prefetched leases, under churn and duplicates


def test_a_model_larger_than_the_heartbeat_window_crosses_a_roblox_link():
    """The 600x600 layer is 1.4 MB: 29 s at 50 kB/s, so sent as one frame it would
    starve the 20 s heartbeat check. Frames sized to the link keep players connected."""
    sc = parse_scenario(
        {
            "name": "slow-link",
            "seed": 1,
            "job": {
                "model": {"widths": [10, 600, 600, 10], "loss": "mse"},
                "data": {"dataset": "teacher:small", "shards": 2, "batch": 16},
                "strategy": {"name": "decentral-async", "tau": 2, "lr": 0.01},
                "link": {"profile": "roblox"},
                "stop": {"max_time_s": 200},
                "lease": {"min_s": 600.0},
            },
            "clients": {"count": 2, "compute": 1e9, "latency": 0.05},
            "run": {"max_steps": 4},
        }
    )
    s = Simulation(sc).run().summary
    assert s["closes"] == 0 and s["drops"] == 0
    assert s["reason"] == "max_steps" and s["results_accepted"] >= 2


def _crowd(
    count: int, staleness: dict, *, prefetch: bool = True, alpha: float | None = None
) -> dict:
    """The shipped digits scenario, players holding the data shards already (as
    returning players do): these tests are about model traffic and staleness; what
    shard transfers cost is test_players_pay_for_shards_... below."""
    from simulations.scenario import load_raw, resolve

    data = load_raw(resolve("digits-time-to-target"))
    data.pop("sweep", None)
    data["clients"]["count"] = count
    data["job"].setdefault("lease", {})["prefetch"] = prefetch  # players ask where it is offered
    data["clients"]["warm_data"] = True
    data["job"]["strategy"]["staleness"] = staleness
    if alpha is not None:  # the merge weights of an older default, its lr as given
        data["job"]["strategy"]["alpha"] = alpha
        data["job"]["strategy"]["lr_scaling"] = "none"
    data["job"]["stop"]["max_time_s"] = 30
    return data


def test_prefetching_the_next_task_hides_the_download(digits):
    """8 players on roblox links: with prefetch the next task's model comes down
    while the last result goes up, so results arrive faster and, on the whole, the
    target is reached sooner, though each task starts from a model without the
    player's own last result (docs/simulations.md). Without it no task is queued.
    Time to target moves by several evaluations from seed to seed (one seed of
    these three is slower with prefetch), so the check is on the sum. The merge
    weights are the ones this was measured with (alpha 0.6 and the hinge at
    a = 0.5, b = 4, the defaults before issue 33), for 10-step tasks, and so are
    the codecs (fp32: the job's default on these links is int8 since session 13,
    and the downloads it hides are a quarter as long)."""
    hinge = {"kind": "hinge", "a": 0.5, "b": 4}
    times = {True: 0.0, False: 0.0}
    for seed in (1, 2, 3):
        runs = {}
        for prefetch in (True, False):
            data = _crowd(8, hinge, prefetch=prefetch, alpha=0.6)
            data["job"]["codecs"] = {"slow_link": "off"}
            data["seed"] = seed
            runs[prefetch] = s = Simulation(parse_scenario(data), dataset=digits).run().summary
            assert s["reason"] == "target_accuracy"
            times[prefetch] += s["time_to_target"]
        on, off = runs[True], runs[False]
        assert off["tasks_prefetched"] == 0
        assert on["tasks_prefetched"] > on["results_accepted"] / 2
        rate_on = on["results_accepted"] / on["time_to_target"]
        rate_off = off["results_accepted"] / off["time_to_target"]
        assert rate_on > 1.3 * rate_off  # a task's download no longer waits for its upload
    assert times[True] < times[False]  # ~10 % sooner on the whole; per seed it is noisy


def test_a_crowd_of_700_players_gets_there_faster_than_8(digits):
    """The default staleness scale keeps the model's movement per task time
    independent of the crowd: 700 players on roblox links reach 0.90 on digits
    sooner than 8 do (docs/simulations.md, "Beyond the seed"; with 1/(1+s),
    the default since issue 33, 15.8 s against 24.2 s). Under the old
    polynomial scale the 700-player run collapsed to one class in fp32 (0.10);
    in int8, the default on these links since session 13, it ends at 0.72 by the
    early stop, never at the target."""
    crowd = Simulation(parse_scenario(_crowd(700, {})), dataset=digits).run().summary
    few = Simulation(parse_scenario(_crowd(8, {})), dataset=digits).run().summary
    assert crowd["reason"] == few["reason"] == "target_accuracy"
    assert crowd["time_to_target"] < 0.75 * few["time_to_target"]
    assert parse_scenario(_crowd(8, {})).job.strategy.staleness.kind == "hinge"  # the default
    poly = {"kind": "polynomial", "a": 0.5}
    old = Simulation(parse_scenario(_crowd(700, poly)), dataset=digits).run().summary
    assert old["reason"] != "target_accuracy" and old["accuracy"] < 0.75


def test_players_pay_for_shards_on_their_links_unless_their_cache_is_warm(digits):
    """A cold player fetches each shard it is named once, over its simulated link; a
    returning player (clients.warm_data) fetches none."""
    sims = {}
    for warm in (False, True):
        sim = Simulation(small(seed=4, warm_data=warm), dataset=digits)
        sims[warm] = (sim, sim.run())
    cold_sim, cold = sims[False]
    warm_sim, warm = sims[True]
    shard_bytes = {s.sha256: len(s.blob) for s in cold_sim.core.data.shards}
    for p in cold_sim.players:
        fetched = p.client.data_bytes
        assert 0 < fetched <= sum(shard_bytes.values())  # each shard at most once
        assert set(p.client.shards) <= set(shard_bytes)
    assert all(p.client.data_bytes == 0 for p in warm_sim.players)
    assert warm.summary["bytes_down"] < cold.summary["bytes_down"]
    assert warm.summary["reason"] == cold.summary["reason"] == "target_accuracy"


def test_players_inside_a_frame_budget_compute_at_its_share(digits):
    """clients.frame_budget_ms scales each player's drawn rate, in both modes."""
    from simulations.costmodel import CostSimulation

    full = Simulation(small(), dataset=digits)
    framed = Simulation(small(frame_budget_ms=4.0), dataset=digits)
    share = framed.scenario.clients.frame_share
    assert 0 < share < 0.25
    for a, b in zip(full.players, framed.players, strict=True):
        assert b.flops == pytest.approx(a.flops * share)
    cost = CostSimulation(small(frame_budget_ms=4.0))
    for a, b in zip(full.players, cost.clients, strict=True):
        assert b.flops == pytest.approx(a.flops * share)
