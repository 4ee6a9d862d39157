"""Sub-model tasks end to end in the core: choosing subnets, slices down, slice
deltas up and merged (coordinator/core/submodel.py, nn/subnet.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from coordinator.core import events as ev
from coordinator.core.assembly import build_core, restore_core
from coordinator.core.config import JobConfigError, SubmodelSection
from coordinator.core.machine import Coordinator
from coordinator.core.submodel import SubmodelPlanner, encoded_bytes
from nn.spec import ModelSpec
from nn.subnet import Subnet
from testkit.loopback import Loopback
from tests.coordinator.coord_helpers import (
    acks,
    deliver,
    digits,
    hello,
    make_job,
    result_messages,
    task_of,
)

WIDE = {"widths": [64, 64, 32, 10]}


def planner(mode: str = "random", seed: int = 0, **kw: Any) -> SubmodelPlanner:
    return SubmodelPlanner(
        SubmodelSection(mode=mode, **kw),
        ModelSpec(widths=(64, 64, 32, 10)),
        model_codec="fp32",
        update_codec="fp32",
        rng=np.random.default_rng(seed),
    )


def choose(p: SubmodelPlanner, **kw: Any) -> Subnet:
    return p.choose(bytes_per_s=kw.pop("bps", None), flops_per_s=kw.pop("flops", None),
                    samples=kw.pop("samples", 160), **kw)  # fmt: skip


# -- choosing -----------------------------------------------------------------------


def test_modes_choose_as_documented() -> None:
    nested = choose(planner("nested", fraction=0.25))
    assert [a.tolist() for a in nested.keep] == [list(range(16)), list(range(8))]
    ist = planner("ist", fraction=0.25)
    first = [choose(ist, round=1) for _ in range(4)]  # a round's four tasks: a partition
    for layer, n in ((0, 64), (1, 32)):
        together = np.concatenate([s.keep[layer] for s in first])
        assert sorted(together.tolist()) == list(range(n))
    again = choose(ist, round=2)  # a new round starts a new order
    assert again.keep[0].size == 16
    rnd = planner("random", fraction=0.5)
    picks = [choose(rnd) for _ in range(20)]
    assert all(s.keep[0].size == 32 and np.all(np.diff(s.keep[0]) > 0) for s in picks)
    assert len({tuple(s.keep[0]) for s in picks}) > 1


@pytest.mark.parametrize("mode", ["random", "ist", "nested"])
def test_groups_keep_whole_runs_of_consecutive_neurons(mode: str) -> None:
    p = planner(mode, fraction=0.3, group=8)  # 64 and 32 wide: 19 and 10 neurons at most
    for _ in range(5):
        s = choose(p, round=1)
        assert [a.size for a in s.keep] == [16, 8]  # whole groups, never above the budget
        for a in s.keep:
            assert np.all(a.reshape(-1, 8) == a.reshape(-1, 8)[:, :1] + np.arange(8))
            assert np.all(a.reshape(-1, 8)[:, 0] % 8 == 0)


def test_same_seed_same_subnets() -> None:
    a = [choose(planner("random", seed=5)).to_wire() for _ in range(3)]
    b = [choose(planner("random", seed=5)).to_wire() for _ in range(3)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_client_gets_the_largest_subnet_its_budget_allows() -> None:
    spec = ModelSpec(widths=(64, 64, 32, 10))
    full = encoded_bytes(spec, "fp32")
    # no budget: the fraction itself
    assert choose(planner(fraction=0.5)).keep[0].size == 32
    # a byte budget below the half's slice: a smaller subnet, within it
    s = choose(planner(fraction=0.5, budget_bytes=full // 8))
    assert encoded_bytes(s.sub, "fp32") <= full // 8
    assert s.keep[0].size < 32
    # a time budget: a slow link gets less than a fast one
    p = planner(fraction=1.0, max_task_s=2.0)
    slow = choose(p, bps=5_000, flops=1e9)
    fast = choose(p, bps=5_000_000, flops=1e9)
    assert slow.keep[0].size < fast.keep[0].size == 64
    # a budget nothing fits still leaves one neuron per layer
    tiny = choose(planner(fraction=1.0, budget_bytes=256))
    assert [a.size for a in tiny.keep] == [1, 1]


def test_planner_state_round_trips() -> None:
    p = planner("ist", fraction=0.25)
    choose(p, round=1)
    state = p.state_dict()
    q = planner("ist", seed=99, fraction=0.25)
    q.load_state_dict(state)
    assert np.array_equal(choose(p, round=1).to_wire(), choose(q, round=1).to_wire())


# -- the job file ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sections", "says"),
    [
        ({"strategy": {"name": "central-async"}}, "decentral-*"),
        ({"strategy": {"name": "decentral-sync", "aggregator": "median"}}, "per-coordinate mean"),
        ({"replication": {"enabled": True}}, "replication"),
        ({"codecs": {"error_feedback": True, "update": "topk:0.1"}}, "residual"),
        ({"model": {"widths": [64, 10]}}, "no hidden layer"),
    ],
)
def test_jobs_that_cannot_take_sub_model_tasks_say_why(sections: dict, says: str) -> None:
    with pytest.raises(JobConfigError, match=says):
        make_job(submodel={"mode": "random"}, **sections)


# -- the core -------------------------------------------------------------------------


def core(name: str = "decentral-async", **sections: Any) -> Coordinator:
    job = make_job(name, model=WIDE, submodel={"mode": "random", "fraction": 0.25}, **sections)
    return build_core(job, seed=1, dataset=digits())


def test_a_sub_model_task_carries_only_its_slice_and_its_delta_lands_there() -> None:
    c = core()
    before = c.model.params.copy()
    task = task_of(c.connect("a", hello("a"), 0.0), "a")
    assert task.subnet is not None and task.spec.widths == (64, 16, 8, 10)
    assert task.base_version is None and task.init_seed is None and task.num_chunks > 0
    lease = c.book.tasks[int(task.task_id)]
    sub = lease.subnet
    assert sub is not None and np.array_equal(sub.to_wire(), task.subnet)
    update = np.full(task.spec.num_params, 1e-3, dtype=np.float32)
    out = deliver(c, "a", result_messages(task, update), 1.0)
    assert acks(out, "a") == [(task.task_id, True, "")]
    moved = c.model.params.data - before.data
    expected = np.float32(c.job.strategy.alpha) * sub.expand(update)
    np.testing.assert_allclose(moved, expected, rtol=1e-4, atol=1e-7)
    assert np.count_nonzero(moved) == sub.sub.num_params  # nothing outside the subnet moved


def test_without_a_window_the_slice_is_merged_in_place() -> None:
    """FedAsync with window 1 adds the slice's delta where it belongs, no dense copy:
    the same model as placing it first."""
    c = core(strategy={"window": 1})
    before = c.model.params.copy()
    task = task_of(c.connect("a", hello("a"), 0.0), "a")
    sub = c.book.tasks[int(task.task_id)].subnet
    update = np.linspace(-1e-3, 1e-3, task.spec.num_params, dtype=np.float32)
    deliver(c, "a", result_messages(task, update), 1.0)
    expected = before.data + np.float32(c.job.strategy.alpha) * sub.expand(update)
    np.testing.assert_allclose(c.model.params.data, expected, rtol=1e-6, atol=1e-7)


def test_an_upload_in_the_whole_model_layout_is_refused() -> None:
    c = core()
    task = task_of(c.connect("a", hello("a"), 0.0), "a")
    whole = dataclasses.replace(task, spec=c.spec, subnet=None)
    out: list[ev.Output] = []
    for msg in result_messages(whole):
        out += c.receive("a", msg, 1.0)
        if "a" not in c.conns:
            break
    closes = [o for o in out if isinstance(o, ev.Close)]
    assert closes and "a" not in c.conns  # a chunk outside the slice's layout
    assert c.model.version == 0


def test_a_slice_result_the_sender_does_not_hold_is_answered_not_closed() -> None:
    """The server may not know a result's layout (a sub-model task of a run before
    a restart, another client's task, an id never issued): its chunks are counted,
    not checked against a layout, and the ack says why it is not taken (§3.6)."""
    c = core()
    ta = task_of(c.connect("a", hello("a"), 0.0), "a")
    task_of(c.connect("b", hello("b"), 0.0), "b")
    update = np.full(ta.spec.num_params, 1e-3, dtype=np.float32)
    out = deliver(c, "b", result_messages(ta, update), 1.0)  # a's task, from b
    never = dataclasses.replace(ta, task_id="999999")
    out += deliver(c, "b", result_messages(never, update), 1.0)
    assert acks(out, "b") == [(ta.task_id, False, "not_leased"), ("999999", False, "unknown_task")]
    assert "b" in c.conns and not [o for o in out if isinstance(o, ev.Close)]
    assert c.model.version == 0
    # after a restart that never saw a's task, a's result is stale, not a bad chunk
    restored = restore_core(c.job, c.state_dict(), seed=1, dataset=digits())
    restored.connect("a", hello("a"), 2.0)
    out = deliver(restored, "a", result_messages(ta, update), 2.0)
    assert acks(out, "a") == [(ta.task_id, False, "stale")] and "a" in restored.conns
    # its framing is still checked: a chunk sent twice is the sender's fault
    msgs = result_messages(never, update)
    out = deliver(restored, "a", [*msgs[:2], msgs[1]], 3.0)
    assert [o for o in out if isinstance(o, ev.Close)] and "a" not in restored.conns


def test_a_connection_uploads_a_few_results_at_once_not_unboundedly() -> None:
    """Headers whose chunks never come are refused past ``MAX_OPEN``: each open
    upload holds state (a model-sized buffer when its task is the sender's)."""
    from coordinator.core.uploads import MAX_OPEN

    c = core()
    ta = task_of(c.connect("a", hello("a"), 0.0), "a")
    header = result_messages(ta)[0]
    out: list[ev.Output] = []
    for i in range(MAX_OPEN):
        out += c.receive("a", dataclasses.replace(header, task_id=str(900000 + i)), 1.0)
    assert "a" in c.conns and not [o for o in out if isinstance(o, ev.Close)]
    out = c.receive("a", dataclasses.replace(header, task_id="999999"), 1.0)
    closes = [o for o in out if isinstance(o, ev.Close)]
    assert closes and "at most" in closes[0].reason and "a" not in c.conns


def test_the_core_never_names_a_slice_as_held() -> None:
    c = core()
    first = task_of(c.connect("a", hello("a"), 0.0), "a")
    out = deliver(c, "a", result_messages(first), 1.0)
    second = task_of(out, "a")
    assert second.base_version is None and second.num_chunks > 0
    assert second.model_transfer != first.model_transfer


def run_digits(
    name: str, mode: str, *, seed: int = 0, **strategy: Any
) -> tuple[Coordinator, Loopback]:
    sections: dict[str, Any] = {
        "model": {"widths": [64, 128, 10]},
        "data": {"shards": 8, "batch": 16},
        "strategy": {"name": name, "tau": 10, "lr": 0.05, **strategy},
        "eval": {"every_versions": 50},
        "stop": {"target_accuracy": 0.9, "max_versions": 1500},
    }
    if mode != "off":
        sections["submodel"] = {"mode": mode, "fraction": 0.25}
    c = build_core(make_job(name, **sections), seed=seed, dataset=digits())
    lb = Loopback(c)
    for i in range(4):
        lb.add_client(f"c{i}", flops=1e8 * (i + 1))
    lb.run(until=1e5)
    return c, lb


def bytes_per_task(lb: Loopback) -> tuple[float, float]:
    down = [o.download_bytes for o in lb.outputs if isinstance(o, ev.TaskLeased)]
    up = [o.frame_bytes for o in lb.outputs if isinstance(o, ev.ResultAccepted)]
    return sum(down) / len(down), sum(up) / len(up)


@pytest.mark.parametrize(
    ("name", "mode", "strategy"),
    [
        ("decentral-async", "random", {}),
        ("decentral-async", "ist", {"aggregation": "fedbuff", "buffer_k": 4}),
        ("decentral-sync", "ist", {}),
    ],
)
def test_digits_learns_from_sub_model_tasks(name: str, mode: str, strategy: dict) -> None:
    """A quarter of the hidden neurons per task: a quarter of the bytes each way,
    and the whole model still learns digits."""
    c, lb = run_digits(name, mode, **strategy)
    fin = c.finished
    assert fin is not None and fin.reason == "target_accuracy", fin
    down, up = bytes_per_task(lb)
    whole = c.spec.nbytes  # a whole fp32 model (what a full download or result carries)
    assert down < 0.3 * whole and up < 0.3 * whole


def test_a_sync_round_with_subnets_survives_a_restart() -> None:
    """Results acknowledged in an open round keep their subnets in the checkpoint:
    the restored round closes to the same model as the uninterrupted one."""
    job = make_job("decentral-sync", model=WIDE, submodel={"mode": "ist", "fraction": 0.5},
                   strategy={"clients_per_round": 2})  # fmt: skip
    a = build_core(job, seed=2, dataset=digits())
    t1 = task_of(a.connect("x", hello("x"), 0.0), "x")
    t2 = task_of(a.connect("y", hello("y"), 0.0), "y")
    rng = np.random.default_rng(0)
    u1 = rng.standard_normal(t1.spec.num_params).astype(np.float32) * 1e-3
    u2 = rng.standard_normal(t2.spec.num_params).astype(np.float32) * 1e-3
    deliver(a, "x", result_messages(t1, u1), 1.0)
    b = restore_core(job, a.state_dict(), seed=2, dataset=digits())
    assert set(b.strategy.subnets) == {int(t1.task_id)}
    # the restored core lost the open tasks: close its round with the same result
    b.strategy.results[int(t2.task_id)] = a.book.tasks[int(t2.task_id)].subnet.expand(u2)
    b.strategy.weights[int(t2.task_id)] = a.strategy.sample_weight(a.book.tasks[int(t2.task_id)])
    b.strategy.subnets[int(t2.task_id)] = a.book.tasks[int(t2.task_id)].subnet
    b.strategy._close(2.0)
    deliver(a, "y", result_messages(t2, u2), 2.0)
    assert a.model.version == b.model.version == 1
    np.testing.assert_array_equal(a.model.params.data, b.model.params.data)
