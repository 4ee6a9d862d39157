"""Adaptive replication (coordinator/core/replication.py): twins, comparison, trust,
exclusion and what a liar's updates cost, on the real core with scripted and
loopback clients."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant

from client.compute import ComputeOutput, run_task
from coordinator.core import events as ev
from coordinator.core.assembly import build_core, restore_core
from coordinator.core.config import JobConfigError
from coordinator.core.judging import Verdict, agree, family, judge, may_take
from coordinator.core.machine import Coordinator
from coordinator.core.replication import Copy
from coordinator.runtime.persist import from_checkpoint, to_checkpoint
from coordinator.runtime.service import CoreService
from nn.params import Params
from protocol import messages as m
from testkit.loopback import Loopback
from tests.coordinator.coord_helpers import (
    acks,
    deliver,
    digits,
    hello,
    make_core,
    make_job,
    only,
    result_messages,
    sent,
    task_of,
)
from tests.coordinator.test_core_machine import CoreMachine

ON = {"enabled": True}
#: a twin's result lands a version or two late: these tests check what lands, so
#: every merge takes its whole step (the default weighs it by 1/(1+s))
WHOLE = {"staleness": {"kind": "constant"}}


def honest(core: Coordinator, task: m.Task, base: np.ndarray) -> np.ndarray:
    """What a conforming client returns for ``task`` from the params ``base``."""
    return run_task(task, Params.from_flat(core.spec, base), digits()).update


def a_pair(**replication: object) -> tuple[Coordinator, np.ndarray, m.Task, m.Task, str]:
    """``a`` joins alone (its task is not replicated: no one could take a twin),
    then ``b``, whose task is; returns (core, version 0, a's task, b's, a's token)."""
    core = make_core(replication={**ON, **replication}, strategy=WHOLE)
    v0 = core.params.data.copy()
    out = core.connect("a", hello("a"), 0.0)
    token = sent(out, "a", m.Welcome)[0].resume_token
    t_a = task_of(out, "a")
    t_b = task_of(core.connect("b", hello("b"), 0.0), "b")
    assert core.verifier.summary()["units"] == 1
    return core, v0, t_a, t_b, token


def test_an_honest_pair_agrees_once_and_the_holder_earns_trust() -> None:
    core, v0, t_a, t_b, _ = a_pair()
    out = deliver(core, "a", result_messages(t_a, honest(core, t_a, v0)), 1.0)
    assert core.version == 1
    twin = task_of(out, "a")  # a, idle again, takes b's twin before new work
    assert twin.task_id != t_b.task_id
    assert (twin.shard, twin.seed, twin.steps, twin.batch) == (t_b.shard, t_b.seed, 2, 8)
    # the model of version 0, which a still holds from its own task: no download
    assert twin.model_version == 0 and twin.base_version == 0 and not sent(out, "a", m.Chunk)
    assert only(out, ev.TaskLeased)[-1].replica
    u = honest(core, t_b, v0)
    before = core.params.data.copy()
    out = deliver(core, "b", result_messages(t_b, u), 2.0)
    assert acks(out, "b") == [(t_b.task_id, True, "")]  # taken (durable), held
    np.testing.assert_array_equal(core.params.data, before)
    out = deliver(core, "a", result_messages(twin, u), 3.0)
    assert acks(out, "a") == [(twin.task_id, True, "")]
    [verified] = only(out, ev.ResultVerified)
    assert verified.agreed and verified.client_ids == ("b", "a") and not verified.losers
    assert only(out, ev.ResultAccepted)[0].replica
    assert core.version == 2  # the unit went in once
    alpha = np.float32(core.job.strategy.alpha)
    np.testing.assert_allclose(core.params.data, before + alpha * u, atol=1e-6)
    trust = {r.client_id: r.trust for r in core.clients()}
    assert trust == {"a": 0, "b": 1}  # the twin's holder earns nothing: a twin is recognisable
    s = core.verifier.summary()
    assert (s["agreed"], s["disagreed"], s["steps"], s["replica_steps"]) == (1, 0, 6, 2)


def test_a_liar_is_caught_excluded_refused_and_its_unchecked_update_reverted() -> None:
    core, v0, t_a, t_b, token = a_pair(strikes=1)  # excluded at the first proof
    alpha = np.float32(core.job.strategy.alpha)
    # a lies: the sign-flipped update has the honest norm, so validation passes it
    out = deliver(core, "a", result_messages(t_a, -honest(core, t_a, v0)), 1.0)
    assert acks(out, "a") == [(t_a.task_id, True, "")] and core.version == 1
    twin = task_of(out, "a")
    u = honest(core, t_b, v0)
    deliver(core, "b", result_messages(t_b, u), 2.0)
    out = deliver(core, "a", result_messages(twin, -u), 3.0)
    [verified] = only(out, ev.ResultVerified)
    assert not verified.agreed and verified.losers == ("a",)
    [excluded] = only(out, ev.ClientExcluded)
    assert (excluded.client_id, excluded.unverified, excluded.reverted) == ("a", 1, 1)
    assert [(c.client_id, c.code) for c in only(out, ev.Close)] == [("a", 4003)]
    assert "excluded" in sent(out, "a", m.Error)[0].message
    assert "a" not in core.conns
    # The lie is subtracted again (a version of its own) and b's honest update is in.
    assert core.version == 3
    np.testing.assert_allclose(core.params.data, v0 + alpha * u, atol=1e-6)
    assert [r.trust for r in core.clients()] == [1]
    s = core.verifier.summary()
    assert (s["disagreed"], s["recomputes"], s["excluded"], s["reverted"]) == (1, 1, 1, 1)
    # Its resume token is refused; a fresh session starts untrusted.
    out = core.connect("a2", hello("a", resume=token), 4.0)
    assert [(c.client_id, c.code) for c in only(out, ev.Close)] == [("a2", 4003)]
    assert "hello.resume" in sent(out, "a2", m.Error)[0].message
    assert only(core.connect("a3", hello("a"), 5.0), ev.ClientJoined)


def test_when_both_copies_disagree_with_the_coordinator_its_own_result_goes_in() -> None:
    core, v0, t_a, t_b, _ = a_pair(strikes=1)
    twin = task_of(deliver(core, "a", result_messages(t_a, honest(core, t_a, v0)), 1.0), "a")
    u = honest(core, t_b, v0)
    deliver(core, "b", result_messages(t_b, np.float32(1.01) * u), 2.0)
    out = deliver(core, "a", result_messages(twin, np.float32(0.99) * u), 3.0)
    assert set(only(out, ev.ResultVerified)[0].losers) == {"a", "b"}
    excluded = {x.client_id: x.reverted for x in only(out, ev.ClientExcluded)}
    assert excluded == {"a": 1, "b": 0}  # a's first (unchecked) update goes out with it
    alpha = np.float32(core.job.strategy.alpha)
    np.testing.assert_allclose(core.params.data, v0 + alpha * u, atol=1e-6)


def test_one_disagreement_does_not_exclude_an_honest_client() -> None:
    """A copy the coordinator's own run disproves is not used and costs its holder
    its trust and a strike; only ``strikes`` (3) of them exclude: an honest client
    can land outside the tolerance once by rounding (issue 34)."""
    core, v0, t_a, t_b, _ = a_pair()
    ua = honest(core, t_a, v0)  # a's own task, not replicated: in at once
    twin = task_of(deliver(core, "a", result_messages(t_a, ua), 1.0), "a")
    u = honest(core, t_b, v0)
    deliver(core, "b", result_messages(t_b, u), 2.0)
    out = deliver(core, "a", result_messages(twin, np.float32(0.9) * u), 3.0)
    assert only(out, ev.ResultVerified)[0].losers == ("a",)
    assert not only(out, ev.ClientExcluded) and not only(out, ev.Close) and "a" in core.conns
    rec = {r.client_id: r for r in core.clients()}["a"]
    assert (rec.strikes, rec.trust, rec.excluded) == (1, 0, False)
    s = core.verifier.summary()
    assert (s["disagreed"], s["struck"], s["excluded"]) == (1, 1, 0)
    alpha = np.float32(core.job.strategy.alpha)
    # a's own update stays in (not reverted), b's goes in for the unit, not a's copy
    np.testing.assert_allclose(core.params.data, v0 + alpha * (ua + u), atol=1e-6)


def test_strikes_count_over_the_last_checked_results_only() -> None:
    """A conforming client lands outside the tolerance about once in 2,000 tasks
    (benchmarks/replicas.py): strikes spread wider than ``strike_window`` checked
    results never exclude it, as many close together do (a liar: every one)."""
    core, *_ = a_pair(strikes=2, strike_window=3)
    rec = {r.client_id: r for r in core.clients()}["a"]
    copy = Copy(task_id=1, holder=rec.resume_id, client_id="a",
                update=np.zeros(3, np.float32), norm=0.0)  # fmt: skip
    verifier = core.verifier
    for _ in range(4):  # a strike, then three clean checks push it out of the window
        verifier._struck(copy, 1.0)
        verifier._passed(rec.resume_id, rec.resume_id, rec.resume_id)
    assert (rec.strikes, rec.excluded) == (4, False) and not verifier.ready
    verifier._struck(copy, 2.0)
    verifier._passed(rec.resume_id)
    verifier._struck(copy, 3.0)  # two strikes within the last three checks
    assert rec.excluded and [type(x).__name__ for x in verifier.ready] == ["Exclusion"]


def test_the_strike_window_must_hold_the_strikes() -> None:
    with pytest.raises(JobConfigError, match="strike_window"):
        make_job(replication={**ON, "strikes": 5, "strike_window": 4})


def test_a_few_far_values_agree_by_distance_and_a_lie_never_does() -> None:
    """A ReLU that flips on a rounding difference moves a few values far; the update
    as a whole stays within ``distance``. Lies move all of it."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal(10_000).astype(np.float32)
    b = a.copy()
    b[:3] += np.float32(0.05)  # three values far outside rtol/atol, 0.09 % of the norm
    tol = {"rtol": 2e-4, "atol": 2e-5}
    assert not agree(a, b, **tol) and agree(a, b, **tol, distance=1e-3)
    for lie in (-a, 2 * a, np.zeros_like(a), a + rng.standard_normal(a.size).astype(np.float32)):
        assert not agree(a, lie, **tol, distance=1e-3)


JS, WASM, OWN = "js-f64", "wasm-simd-f32", "numba-f32"


def kernel_pair(
    ka: str, kb: str, **replication: object
) -> tuple[Coordinator, np.ndarray, m.Task, m.Task, str]:
    """``a_pair`` with kernel families: ``a`` says ``ka`` in hello, ``b`` says ``kb``."""
    core = make_core(replication={**ON, **replication}, strategy=WHOLE)
    v0 = core.params.data.copy()
    out = core.connect("a", hello("a", kernel=ka), 0.0)
    token = sent(out, "a", m.Welcome)[0].resume_token
    t_a = task_of(out, "a")
    t_b = task_of(core.connect("b", hello("b", kernel=kb), 0.0), "b")
    assert core.verifier.summary()["units"] == 1
    return core, v0, t_a, t_b, token


def test_a_twin_waits_for_a_client_of_the_holders_kernel() -> None:
    """b computes with WASM: a (JS) is idle first but gets new work, c (WASM)
    joining later takes b's twin; nothing went to another family."""
    core, v0, t_a, t_b, _ = kernel_pair(JS, WASM)
    out = deliver(core, "a", result_messages(t_a, honest(core, t_a, v0)), 1.0)
    assert not only(out, ev.TaskLeased)[-1].replica  # new work, not b's twin
    out = core.connect("c", hello("c", kernel=WASM), 1.5)
    twin = task_of(out, "c")
    assert only(out, ev.TaskLeased)[-1].replica
    assert (twin.shard, twin.seed, twin.steps) == (t_b.shard, t_b.seed, t_b.steps)
    s = core.verifier.summary()
    assert (s["twins"], s["cross_kernel"]) == (1, 0)


def test_after_twin_wait_s_a_client_of_any_kernel_takes_the_twin() -> None:
    """The fallback: a unit whose holder's family no idle client has is not left
    unchecked; after ``twin_wait_s`` (from its primary's lease) anyone takes it."""
    core, v0, t_a, t_b, _ = kernel_pair(JS, WASM, twin_wait_s=0.5)
    out = deliver(core, "a", result_messages(t_a, honest(core, t_a, v0)), 1.0)
    assert only(out, ev.TaskLeased)[-1].replica
    assert task_of(out, "a").seed == t_b.seed
    assert core.verifier.summary()["cross_kernel"] == 1
    # an unknown holder's family is no family: anyone at once (as before hello.kernel)
    core, v0, t_a, t_b, _ = kernel_pair(JS, "")
    out = deliver(core, "a", result_messages(t_a, honest(core, t_a, v0)), 1.0)
    assert only(out, ev.TaskLeased)[-1].replica


def _cross_pair(ka: str, kb: str, off: float) -> tuple[Coordinator, list[ev.Output], np.ndarray]:
    """b's primary (``kb``) honest, a's twin (``ka``, taken after the wait) ``off``
    times the honest update; returns the core, the twin's outputs and the update."""
    core, v0, t_a, t_b, _ = kernel_pair(ka, kb, twin_wait_s=0.5, strikes=1)
    twin = task_of(deliver(core, "a", result_messages(t_a, honest(core, t_a, v0)), 1.0), "a")
    u = honest(core, t_b, v0)
    deliver(core, "b", result_messages(t_b, u), 2.0)
    return core, deliver(core, "a", result_messages(twin, np.float32(off) * u), 3.0), u


def test_a_copy_of_another_kernel_off_the_own_run_is_inconclusive() -> None:
    """Across families the own run cannot prove a JS copy wrong (over a long task
    its rounding parts from numba's): no strike, not used, no trust."""
    core, out, _ = _cross_pair(JS, WASM, 0.9)
    [verified] = only(out, ev.ResultVerified)
    assert not verified.agreed and verified.losers == () and verified.inconclusive == ("a",)
    assert not only(out, ev.ClientExcluded) and "a" in core.conns
    rec = {r.client_id: r for r in core.clients()}
    assert (rec["a"].strikes, rec["a"].recent_checks, rec["b"].trust) == (0, 0, 1)
    s = core.verifier.summary()
    assert (s["disagreed"], s["inconclusive"], s["struck"], s["excluded"]) == (1, 1, 0, 0)
    # the same copy from a client of the coordinator's own kernel is proof
    core, out, _ = _cross_pair(OWN, WASM, 0.9)
    assert only(out, ev.ResultVerified)[0].losers == ("a",)
    assert [x.client_id for x in only(out, ev.ClientExcluded)] == ["a"]
    # and so is one from a client that named no (or no known) kernel
    core, out, _ = _cross_pair("webgpu-f16", WASM, 0.9)
    assert only(out, ev.ResultVerified)[0].losers == ("a",)


def test_a_liar_paired_with_its_own_kernel_is_struck_and_excluded() -> None:
    """Both JS, bit-exact with each other, so one is wrong: the copy nearer the own
    run wins and goes in even when it is itself off the own run (rounding over a
    long task), and the other, also off the own run, is struck."""
    core, v0, t_a, t_b, _ = kernel_pair(JS, JS, strikes=1)
    twin = task_of(deliver(core, "a", result_messages(t_a, honest(core, t_a, v0)), 1.0), "a")
    u = honest(core, t_b, v0)
    drifted = np.float32(1.01) * u  # 1 % off in relative L2: outside ``distance``
    deliver(core, "b", result_messages(t_b, drifted), 2.0)
    out = deliver(core, "a", result_messages(twin, -u), 3.0)
    [verified] = only(out, ev.ResultVerified)
    assert verified.losers == ("a",) and verified.inconclusive == ()
    assert [x.client_id for x in only(out, ev.ClientExcluded)] == ["a"]
    alpha = np.float32(core.job.strategy.alpha)
    np.testing.assert_allclose(core.params.data, v0 + alpha * drifted, atol=1e-6)
    assert core.verifier.summary()["inconclusive"] == 0


def test_judge_by_what_can_prove_it() -> None:
    own = np.linspace(-1, 1, 1000).astype(np.float32)
    near, far, lie = own * np.float32(1.01), own * np.float32(1.05), -own
    tol = {"rtol": 2e-4, "atol": 2e-5, "distance": 1e-3}
    R, W, I = Verdict.RIGHT, Verdict.WRONG, Verdict.INCONCLUSIVE
    assert judge(near, lie, own, kernels=(JS, JS), **tol) == (R, W)
    assert judge(lie, near, own, kernels=(WASM, WASM), **tol) == (W, R)
    assert judge(own, far, own, kernels=(JS, JS), **tol) == (R, W)
    assert judge(near, far, own, kernels=(JS, WASM), **tol) == (I, I)
    assert judge(near, own, own, kernels=(OWN, JS), **tol) == (W, R)
    assert judge(near, far, own, kernels=("", OWN), **tol) == (W, W)
    assert judge(near, far, own, kernels=(OWN, OWN), **tol) == (W, W)
    assert [family(k) for k in (JS, OWN, "", "webgpu-f16")] == [JS, OWN, "", ""]
    assert may_take(WASM, WASM, 0.0, 10.0) and not may_take(WASM, JS, 9.9, 10.0)
    assert may_take(WASM, JS, 10.0, 10.0) and may_take("", JS, 0.0, 10.0)


def test_a_resumed_session_keeps_its_record_with_the_kernel_of_its_hello() -> None:
    core, _, _, _, token = kernel_pair(JS, WASM)
    core.disconnect("a", 1.0)
    core.connect("a2", hello("a", resume=token, kernel=JS), 2.0)
    rec = {r.client_id: r for r in core.clients()}["a2"]
    assert (rec.resume_id, rec.kernel) == (token, JS)


def test_replication_counters_round_trip_and_an_old_checkpoint_loads() -> None:
    core, *_ = _cross_pair(JS, WASM, 0.9)
    state = core.verifier.state_dict()
    assert state["stats"]["inconclusive"] == 1 and state["stats"]["cross_kernel"] >= 1
    fresh = make_core(replication=ON).verifier
    fresh.load_state_dict(state)
    assert fresh.summary() == core.verifier.summary()
    old = {**state, "stats": {k: v for k, v in state["stats"].items()
                              if k not in ("inconclusive", "cross_kernel")}}  # fmt: skip
    fresh = make_core(replication=ON).verifier
    fresh.load_state_dict(old)
    assert (fresh.summary()["inconclusive"], fresh.summary()["disagreed"]) == (0, 1)


def test_a_lost_twin_lets_the_held_result_in_unchecked() -> None:
    core, v0, t_a, t_b, _ = a_pair()
    deliver(core, "a", result_messages(t_a, honest(core, t_a, v0)), 1.0)
    deliver(core, "b", result_messages(t_b, honest(core, t_b, v0)), 2.0)
    assert core.version == 1  # held
    core.disconnect("a", 3.0)  # the twin's client leaves: the twin is dropped
    assert core.version == 2
    s = core.verifier.summary()
    assert (s["unchecked"], s["agreed"], s["units"]) == (1, 0, 2)  # b's next task is a unit
    assert [r.trust for r in core.clients()] == [0]


def test_an_expired_twin_lets_the_held_result_in_and_its_late_result_is_stale() -> None:
    core, v0, t_a, t_b, _ = a_pair()
    out = deliver(core, "a", result_messages(t_a, honest(core, t_a, v0)), 1.0)
    twin = task_of(out, "a")
    u = honest(core, t_b, v0)
    deliver(core, "b", result_messages(t_b, u), 2.0)
    deadline = only(out, ev.TaskLeased)[-1].deadline
    out = core.tick(deadline + 0.1)
    assert [e.task_id for e in only(out, ev.LeaseExpired)] == [int(twin.task_id)]
    assert core.version == 2 and core.verifier.summary()["unchecked"] == 1
    out = deliver(core, "a", result_messages(twin, u), deadline + 0.2)
    assert acks(out, "a") == [(twin.task_id, False, "stale")]
    assert core.version == 2


def test_a_held_result_survives_a_checkpoint() -> None:
    core, v0, t_a, t_b, _ = a_pair()
    deliver(core, "a", result_messages(t_a, honest(core, t_a, v0)), 1.0)
    u = honest(core, t_b, v0)
    deliver(core, "b", result_messages(t_b, u), 2.0)
    assert core.version == 1
    state = from_checkpoint(to_checkpoint(core.job, core.state_dict(), created_at=0.0))
    assert int(t_b.task_id) in state["accepted_tasks"]
    restored = restore_core(core.job, state, seed=0, dataset=digits())
    expected = core.params.data + np.float32(core.job.strategy.alpha) * u
    out = restored.tick(10.0)  # the twin's lease died with the old process: unchecked
    assert [o.version for o in only(out, ev.ModelUpdated)] == [2]
    np.testing.assert_allclose(restored.params.data, expected, atol=1e-6)
    assert restored.verifier.summary()["units"] == 2


def test_no_twin_without_a_second_client_and_never_to_the_holder() -> None:
    core = make_core(replication=ON, strategy=WHOLE)
    v0 = core.params.data.copy()
    t1 = task_of(core.connect("a", hello("a"), 0.0), "a")
    out = deliver(core, "a", result_messages(t1, honest(core, t1, v0)), 1.0)
    assert not only(out, ev.TaskLeased)[-1].replica
    assert core.verifier.summary()["units"] == 0


def test_the_rate_falls_to_one_over_trust_with_a_floor() -> None:
    v = make_core(replication={**ON, "base_rate": 0.5}).verifier
    assert [v.rate(t) for t in (0, 9)] == [0.5, 0.5]
    assert v.rate(10) == pytest.approx(0.1) and v.rate(16) == pytest.approx(1 / 16)
    assert v.rate(20) == pytest.approx(0.05) and v.rate(1000) == pytest.approx(0.05)


def _crowd(seed: int = 1, n: int = 4, **replication: object) -> tuple[Coordinator, Loopback]:
    job = make_job(
        replication={**ON, **replication},
        stop={"max_versions": 100_000, "patience": 0},
        eval={"every_versions": 100_000},
    )
    core = build_core(job, seed=seed, dataset=digits())
    lb = Loopback(core)
    for i in range(n):
        lb.add_client(f"c{i}", flops=1e9 * (1 + 0.3 * i))
    return core, lb


def test_honest_clients_always_agree_and_once_trusted_replication_costs_under_10_percent():
    core, lb = _crowd()
    t = 0.0
    while not core.clients() or any(r.trust < 10 for r in core.clients()):
        t += 0.01
        lb.run(until=t)
        assert t < 5, "trust was not established"
    first = core.verifier.summary()
    assert first["overhead"] > 0.2  # the untrusted start: about every task twice
    lb.run(until=t + 0.4)
    last = core.verifier.summary()
    assert last["agreed"] > first["agreed"] and last["disagreed"] == 0 == last["excluded"]
    steps = last["steps"] - first["steps"]
    replica = last["replica_steps"] - first["replica_steps"]
    assert steps > 1000
    assert replica / steps <= 0.10  # counted in steps; about 0.05 / 1.05 here
    pairs = [o.client_ids for o in lb.outputs if isinstance(o, ev.ResultVerified)]
    assert pairs and all(a != b for a, b in pairs)


@pytest.mark.parametrize("honest_for", [0, 40])
def test_a_sign_flipping_client_in_a_crowd_is_excluded_and_no_honest_one_is(honest_for):
    """From its first task, or a sleeper that lies once trusted (its unchecked updates,
    honest or not, are subtracted when it is caught)."""
    core, lb = _crowd(trust_after=5)
    computed = [0]

    def lie(out: ComputeOutput) -> ComputeOutput:
        computed[0] += 1
        return out if computed[0] <= honest_for else dataclasses.replace(out, update=-out.update)

    lb.lies["c2"] = lie
    lb.run(until=0.5)
    excluded = [o for o in lb.outputs if isinstance(o, ev.ClientExcluded)]
    assert [x.client_id for x in excluded] == ["c2"]
    assert (excluded[0].reverted > 0) == (honest_for > 0)
    closes = [(o.client_id, o.code) for o in lb.outputs if isinstance(o, ev.Close)]
    assert closes == [("c2", 4003)]
    assert {r.client_id for r in core.clients()} == {"c0", "c1", "c3"}
    verified = [o for o in lb.outputs if isinstance(o, ev.ResultVerified)]
    assert {o.losers for o in verified} == {(), ("c2",)}
    assert core.params.is_finite()


def test_a_run_is_a_function_of_its_seed() -> None:
    def run(seed: int) -> tuple[np.ndarray, dict]:
        core, lb = _crowd(seed=seed, trust_after=3)
        lb.lies["c1"] = lambda out: dataclasses.replace(out, update=-out.update)
        lb.run(until=0.2)
        return core.params.data.copy(), core.verifier.summary()

    p1, s1 = run(3)
    p2, s2 = run(3)
    np.testing.assert_array_equal(p1, p2)
    assert s1 == s2 and s1["units"] > 0


def test_replication_needs_comparable_results() -> None:
    with pytest.raises(JobConfigError, match=r"replication\.enabled: needs fp32"):
        make_job(replication=ON, codecs={"delta": "fp16"})
    with pytest.raises(JobConfigError, match=r"replication\.enabled: needs an async"):
        make_job("decentral-sync", replication=ON)
    with pytest.raises(JobConfigError, match="error feedback"):
        make_job(replication=ON, codecs={"error_feedback": True})
    assert make_job("central-async", replication=ON).replication.enabled


_f32 = st.floats(-1e3, 1e3, allow_nan=False, width=32)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(_f32, st.floats(-1, 1), st.floats(-1, 1)), min_size=1, max_size=32),
)
def test_two_conforming_results_agree_with_slack_two(rows: list) -> None:
    """Each within §12.8's tolerance of the exact result: within twice it of each other."""
    want = np.array([r[0] for r in rows], np.float64)
    tol = 1e-5 + 1e-4 * np.abs(want)
    a = (want + 0.999 * tol * np.array([r[1] for r in rows])).astype(np.float32)
    b = (want + 0.999 * tol * np.array([r[2] for r in rows])).astype(np.float32)
    # float32 rounding of a and b adds at most an ulp, inside the slack's headroom
    assert agree(a, b, rtol=2e-4, atol=2e-5) and agree(b, a, rtol=2e-4, atol=2e-5)
    far = a.copy()
    far[0] = np.float32(a[0] + 3 * (2e-5 + 2e-4 * abs(float(a[0]))))
    assert not agree(far, a, rtol=2e-4, atol=2e-5)


def test_the_service_shows_the_counters_that_status_reports() -> None:
    with CoreService(make_job(replication=ON), dataset=digits()) as service:
        assert service.stats.replication is None  # nothing emitted yet
        for name in ("a", "b"):
            service.submit_connect(name, hello(name))
        # inputs run in order, each one's outputs counted before the next
        assert service.call(lambda core: len(core.conns)).result(10) == 2
        stats = service.stats.replication
    assert stats is not None and stats["units"] == 1 and stats["overhead"] == 0.0


class ReplicatedMachine(CoreMachine):
    """The core's state machine (test_core_machine.py) with replication on: the
    scripted clients' constant updates agree when equal and otherwise all lose
    to the coordinator's own result, so exclusions and refused resumes happen."""

    @initialize(
        strategy=st.sampled_from(("central-async", "decentral-async")),
        fedbuff=st.booleans(),
        seed=st.integers(0, 3),
    )
    def setup(self, strategy: str, fedbuff: bool, seed: int) -> None:
        self.job = make_job(
            strategy,
            strategy={
                "aggregation": "fedbuff" if fedbuff else "fedasync",
                "buffer_k": 2,
                "max_staleness": 3,
            },
            lease={"min_s": 10.0, "heartbeat_timeout_s": 40.0, "resume_grace_s": 20.0},
            validation={"max_rejections": 3, "norm_warmup": 2},
            checkpoint={"every_versions": 3},
            replication={**ON, "trust_after": 2, "base_rate": 0.7},
        )
        self.seed = seed
        self.core = build_core(self.job, seed=seed, dataset=digits())

    @invariant()
    def accepted_results_are_counted(self) -> None:
        """Taken results go in at most once each; held ones wait in the book."""
        if self.core is None:
            return
        taken = sum(isinstance(o, ev.ResultAccepted) for o in self.outputs)
        core = self.core
        assert core.accepted_results == core.model.contributions + core.strategy.pending()
        assert core.accepted_results <= taken
        s = core.verifier.summary()
        assert s["agreed"] + s["disagreed"] + s["unchecked"] + s["cancelled"] <= s["units"]


ReplicatedMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestReplicatedMachine = ReplicatedMachine.TestCase
