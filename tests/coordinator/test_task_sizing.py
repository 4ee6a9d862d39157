"""tau = "auto": each client's task sized by its speed and link (leases.task_steps),
its lr scaled by the crowd's concurrency (strategy.lr_scaling), and the norm check
per unit of effort (results.py), so tasks of different sizes are judged alike."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.core.assembly import restore_core
from coordinator.core.config import JobConfigError, parse_job
from coordinator.core.leases import task_steps
from protocol import messages as m
from protocol.limits import profile
from tests.coordinator.coord_helpers import (
    acks,
    deliver,
    digits,
    hello,
    make_core,
    result_messages,
    task_of,
)

SIZING = {
    "flops_per_step": 1e6,
    "transfer_bytes": 1e6,
    "bytes_per_s": 1e9,
    "rows": 1_000_000,
    "batch": 16,
    "task_seconds": 1.0,
    "transfer_ratio": 5.0,
    "max_epochs": 1.0,
    "tau_min": 10,
    "tau_max": 5000,
}


def test_a_task_computes_for_its_seconds_at_the_clients_rate():
    assert task_steps(flops_per_s=1e9, **SIZING) == 1000  # 1 s at 1 GFLOP/s, 1 MFLOP/step
    assert task_steps(flops_per_s=2e9, **SIZING) == 2000


def test_a_slow_link_makes_the_task_longer():
    slow = {**SIZING, "bytes_per_s": 1e6}  # 1 s to move the model and the update
    assert task_steps(flops_per_s=1e9, **slow) == 5000  # 5 x the transfer


def test_one_pass_over_the_shard_at_most_and_the_bounds_hold():
    small = {**SIZING, "rows": 1600}  # 100 batches
    assert task_steps(flops_per_s=1e9, **small) == 100
    assert task_steps(flops_per_s=1e3, **SIZING) == 10  # tau_min
    assert task_steps(flops_per_s=1e15, **SIZING) == 5000  # tau_max


@given(
    flops=st.floats(1e3, 1e13),
    faster=st.floats(1.0, 100.0),
    bps=st.floats(1e3, 1e10),
    rows=st.integers(1, 10**7),
)
def test_steps_stay_in_bounds_and_never_fall_with_speed(flops, faster, bps, rows):
    kw = {**SIZING, "bytes_per_s": bps, "rows": rows}
    a = task_steps(flops_per_s=flops, **kw)
    b = task_steps(flops_per_s=flops * faster, **kw)
    assert 10 <= a <= b <= 5000


def test_a_faster_client_gets_a_longer_task_and_a_fixed_tau_is_kept():
    job = {"data": {"shards": 1, "batch": 8}, "strategy": {"tau": "auto"}}
    core = make_core(**job)
    slow = task_of(core.connect("a", m.Hello(client="a", flops=1e6), 0.0), "a")
    fast = task_of(core.connect("b", m.Hello(client="b", flops=1e7), 0.0), "b")
    assert 10 <= slow.steps < fast.steps
    fixed = make_core(**{**job, "strategy": {"tau": 7}})
    assert task_of(fixed.connect("a", m.Hello(client="a", flops=1e6), 0.0), "a").steps == 7


def test_the_default_task_is_short_on_a_fast_link_and_long_on_a_slow_one():
    """The job's defaults: a lan client on large shards averages every quarter
    second; a roblox client's task is set by its transfer, a small shard's by one
    pass, neither by ``task_seconds`` (docs/coordinator.md, tau = "auto")."""
    st = parse_job({}).strategy
    model = 4 * 84_490  # [64, 256, 256, 10] in fp32
    kw = {
        "flops_per_step": 6 * 84_490 * 16,
        "flops_per_s": 5e10,
        "transfer_bytes": 2 * model,
        "rows": 125_000,
        "batch": 16,
        "task_seconds": st.task_seconds,
        "transfer_ratio": st.transfer_ratio,
        "max_epochs": st.max_epochs,
        "tau_min": st.tau_min,
        "tau_max": st.tau_max,
    }
    per_s = kw["flops_per_s"] / kw["flops_per_step"]
    lan = task_steps(bytes_per_s=profile("lan").bytes_per_s, **kw)
    assert lan / per_s == pytest.approx(0.25, rel=0.01)
    slow = {**kw, "flops_per_s": 2.4e8}  # the seed's player
    roblox = task_steps(bytes_per_s=profile("roblox").bytes_per_s, **slow)
    transfer_s = 2 * model / profile("roblox").bytes_per_s  # 13.5 s
    assert roblox == math.ceil(5 * transfer_s * 2.4e8 / kw["flops_per_step"])
    assert task_steps(bytes_per_s=1e9, **{**kw, "rows": 168}) == st.tau_min  # digits


def test_tau_errors_name_the_field():
    with pytest.raises(JobConfigError, match=r"strategy\.tau"):
        parse_job({"strategy": {"tau": 0}})
    with pytest.raises(JobConfigError, match=r"tau_max \(5\) must be >= tau_min \(10\)"):
        parse_job({"strategy": {"tau_max": 5}})
    assert parse_job({}).strategy.tau == "auto"
    assert parse_job({"strategy": {"tau": 12}}).strategy.nominal_tau == 12
    assert parse_job({}).strategy.nominal_tau == round(math.sqrt(10 * 5000))


def test_the_lr_grows_with_the_crowds_concurrency_up_to_its_bound():
    core = make_core(strategy={"lr_scale_max": 3.0, "lr_scale_crowd_max": 1.0})  # linear only
    strategy = core.strategy
    assert strategy.lr_scale() == 1.0
    for _ in range(50):
        strategy.observe_concurrency(9)  # ten tasks in flight together
    assert strategy.lr_scale() == 3.0
    task = task_of(core.connect("a", hello("a"), 0.0), "a")
    assert task.optimizer["lr"] == pytest.approx(3.0 * core.job.strategy.lr)
    none = make_core(strategy={"lr_scaling": "none"})
    none.strategy.observe_concurrency(9)
    assert none.strategy.lr_scale() == 1.0
    sqrt = make_core(strategy={"lr_scaling": "sqrt"})
    for _ in range(50):
        sqrt.strategy.observe_concurrency(3)
    assert sqrt.strategy.lr_scale() == pytest.approx(2.0, rel=1e-3)


def test_a_large_crowd_scales_its_lr_by_sqrt_past_the_linear_bound():
    """The default for SGD tasks: K up to lr_scale_max (4), and past K = 16 the
    gentler sqrt(K), up to lr_scale_crowd_max (8). Crowds of up to 16 in flight
    (2 or 14 lan clients, 8 roblox players) keep the linear rule exactly."""

    def scale(k: float, **strategy: float) -> float:
        core = make_core(strategy=strategy)
        for _ in range(200):
            core.strategy.observe_concurrency(k - 1)  # staleness k - 1: K = k
        return core.strategy.lr_scale()

    assert scale(2) == pytest.approx(2.0, rel=1e-3)
    assert scale(10) == pytest.approx(4.0)
    assert scale(16) == pytest.approx(4.0, rel=1e-3)
    assert scale(36) == pytest.approx(6.0, rel=1e-3)
    assert scale(64) == pytest.approx(8.0, rel=1e-3)
    assert scale(700) == pytest.approx(8.0)
    assert scale(700, lr_scale_crowd_max=1.0) == 4.0  # linear only, as before
    assert scale(700, lr_scaling="linear") == 4.0


def test_a_long_task_takes_at_most_max_scaled_steps_over_its_steps_of_the_crowds_lr():
    """Under "auto" a task's crowd multiplier is at most max_scaled_steps (4096)
    over its local steps, never below 1: a roblox player's 75-step task keeps the
    crowd's 4x, a lan client's 2,048-step one takes 2x (docs/performance.md,
    "Session 22"). The plateau cut still multiplies it; a rule the job names
    ("linear", "sqrt") is the job's own and is not capped."""
    core = make_core(strategy={"tau": 2048})
    for _ in range(200):
        core.strategy.observe_concurrency(13)  # K = 14: the linear rule's 4x
    strategy = core.strategy
    assert strategy.lr_scale() == pytest.approx(4.0)
    assert strategy.lr_scale(75) == pytest.approx(4.0)
    assert strategy.lr_scale(1024) == pytest.approx(4.0)
    assert strategy.lr_scale(2048) == pytest.approx(2.0)
    assert strategy.lr_scale(100_000) == 1.0
    task = task_of(core.connect("a", hello("a"), 0.0), "a")
    assert task.steps == 2048
    assert task.optimizer["lr"] == pytest.approx(2.0 * core.job.strategy.lr)
    strategy.plateau.decay = 0.25
    assert strategy.lr_scale(2048) == pytest.approx(0.5)
    tight = make_core(strategy={"max_scaled_steps": 512})
    for _ in range(200):
        tight.strategy.observe_concurrency(13)
    assert tight.strategy.lr_scale(256) == pytest.approx(2.0)
    linear = make_core(strategy={"lr_scaling": "linear"})
    for _ in range(200):
        linear.strategy.observe_concurrency(13)
    assert linear.strategy.lr_scale(100_000) == pytest.approx(4.0)
    with pytest.raises(JobConfigError, match=r"strategy\.max_scaled_steps"):
        parse_job({"strategy": {"max_scaled_steps": 0}})


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_momentum_and_adam_tasks_keep_the_jobs_lr_unless_the_job_scales_them(optimizer):
    """By default ("auto") only plain SGD tasks take the crowd's larger lr: a
    momentum task already steps lr / (1 - momentum), and scaled by K it went
    unstable (docs/performance.md, "Session 12"). A job may still ask for it."""
    auto = make_core(strategy={"client_optimizer": optimizer})
    for _ in range(50):
        auto.strategy.observe_concurrency(9)
    assert auto.strategy.lr_scale() == 1.0
    task = task_of(auto.connect("a", hello("a"), 0.0), "a")
    assert task.optimizer["kind"] == optimizer
    assert task.optimizer["lr"] == pytest.approx(auto.job.strategy.lr)
    linear = make_core(strategy={"client_optimizer": optimizer, "lr_scaling": "linear"})
    for _ in range(50):
        linear.strategy.observe_concurrency(9)
    assert linear.strategy.lr_scale() == linear.job.strategy.lr_scale_max
    sgd = make_core(strategy={"client_optimizer": "sgd"})
    for _ in range(50):
        sgd.strategy.observe_concurrency(9)
    assert sgd.strategy.lr_scale() == sgd.job.strategy.lr_scale_max


def test_norms_are_judged_per_step_at_the_tasks_lr():
    """A task with twice the steps at twice the lr may move four times as far as
    the median task: judged per unit of effort, it is an ordinary update."""
    core = make_core()
    per_step = core.validator.median()
    assert per_step is not None
    for _ in range(50):
        core.strategy.observe_concurrency(1)  # lr x 2 for the next task
    task = task_of(core.connect("a", hello("a"), 0.0), "a")
    effort = task.steps * task.optimizer["lr"] / core.job.strategy.lr
    assert effort == pytest.approx(2 * task.steps, rel=1e-3)
    n = task.spec.num_params
    long = np.full(n, 5 * per_step * effort / np.sqrt(n), np.float32)  # 5x: under 10x
    out = deliver(core, "a", result_messages(task, long), 1.0)
    assert acks(out, "a") == [(task.task_id, True, "")]


def test_the_lr_halves_on_a_held_out_plateau_and_survives_a_checkpoint():
    core = make_core(strategy={"plateau_patience": 3, "lr_scaling": "none"})
    s = core.strategy

    def evaluated(loss: float, versions: int = 1) -> None:
        s.model.version += versions
        s.model.progress += versions  # tasks of a round's length
        s.on_evaluation(loss)

    for loss in (2.0, 1.5, 1.0):  # improving: no cut
        evaluated(loss)
    assert s.lr_scale() == 1.0
    for loss in (1.1, 1.2, float("nan"), 1.05):  # three without a new best (NaN ignored)
        evaluated(loss)
    assert s.lr_scale() == 0.5
    for _ in range(50):  # a crowd of ten in flight: three evaluations are not 3 rounds
        s.observe_concurrency(9)
    for loss in (1.1, 1.1, 1.1):
        evaluated(loss)
    assert s.lr_scale() == 0.5
    evaluated(1.1, versions=30)
    assert s.lr_scale() == 0.25
    task = task_of(core.connect("a", hello("a"), 0.0), "a")
    assert task.optimizer["lr"] == pytest.approx(0.25 * core.job.strategy.lr)
    for _ in range(30):  # a long plateau: down to plateau_min, no further
        evaluated(5.0, versions=10)
    assert s.lr_scale() == 0.125
    again = make_core(strategy={"plateau_patience": 3, "lr_scaling": "none"})
    again.strategy.load_state_dict(s.state_dict())
    assert again.strategy.lr_scale() == 0.125
    off = make_core(strategy={"plateau_patience": 0, "lr_scaling": "none"})
    for _ in range(30):
        off.strategy.model.version += 10
        off.strategy.model.progress += 10
        off.strategy.on_evaluation(5.0)
    assert off.strategy.lr_scale() == 1.0


def test_a_task_shorter_than_a_round_counts_for_its_share_of_one():
    """The plateau's and the early stop's clock (ModelState.progress): a task of
    ``round_seconds`` (or of one pass, where that is less) moves it by one, a
    shorter one by its share, so that shorter tasks do not cut the lr sooner in
    training done; a task longer than a round (a slow link's) counts as one."""
    job = {"data": {"shards": 1, "batch": 8}, "strategy": {"tau": "auto", "tau_min": 1}}

    def merged(flops: float, **strategy: object) -> tuple[int, float]:
        core = make_core(**{**job, "strategy": {**job["strategy"], **strategy}})
        task = task_of(core.connect("a", m.Hello(client="a", flops=flops), 0.0), "a")
        assert acks(deliver(core, "a", result_messages(task), 1.0)) == [(task.task_id, True, "")]
        assert core.model.version == 1
        return task.steps, core.model.progress

    steps, progress = merged(1e7, task_seconds=0.1)  # neither bound applies
    round_steps, one = merged(1e7, task_seconds=0.25)
    assert one == 1.0 and progress == pytest.approx(steps / round_steps)
    assert progress == pytest.approx(0.4, rel=0.05)
    assert merged(1e7, task_seconds=1.0)[1] == 1.0  # longer than a round: one
    short_pass, whole = merged(1e9, task_seconds=0.1)  # one pass of the shard binds both
    assert whole == 1.0 and short_pass == math.floor(len(digits().X_train) / 8)
    assert merged(1e7, task_seconds=0.1, round_seconds=0.1)[1] == 1.0
    fixed = make_core(**{**job, "strategy": {"tau": 3, "tau_min": 1}})  # a job's own tau
    task = task_of(fixed.connect("a", m.Hello(client="a", flops=1e7), 0.0), "a")
    deliver(fixed, "a", result_messages(task), 1.0)
    assert fixed.model.progress == pytest.approx(3 / round_steps)
    again = restore_core(fixed.job, fixed.state_dict(), seed=0, dataset=digits())
    assert again.model.progress == fixed.model.progress  # the clock survives a checkpoint


def test_the_job_is_told_once_when_its_shards_leave_tasks_link_bound(caplog):
    """A roblox client's task is capped at one pass over a small shard, shorter
    than its own transfers: the operator hears it once (fewer, larger shards
    would carry more training per byte); a lan client's is never such."""
    caplog.set_level("WARNING", logger="coordinator.core.issuing")
    slow = make_core(strategy={"tau": "auto"}, link={"profile": "roblox"})
    for name in ("a", "b"):
        task = task_of(slow.connect(name, hello(name), 0.0), name)
        assert task.steps * task.batch <= slow.data.shard(task.shard).rows  # one pass
    said = [r for r in caplog.records if "data.shards" in r.getMessage()]
    assert len(said) == 1 and "pass(es) over their" in said[0].getMessage()
    caplog.clear()
    fast = make_core(strategy={"tau": "auto"}, link={"profile": "lan"})
    task_of(fast.connect("a", hello("a"), 0.0), "a")
    assert not [r for r in caplog.records if "data.shards" in r.getMessage()]
