"""Layer-split jobs on the real core (coordinator/core/layersplit.py, docs/protocol.md
§3.3.2): in-process client sessions over the wire encoding, the real nn core."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from client.compute import ComputeOutput
from client.session import Capabilities
from coordinator.core import events as ev
from coordinator.core.assembly import build_core, restore_core
from coordinator.core.config import JobConfigError, parse_job
from coordinator.core.data import DataCatalog
from coordinator.core.layersplit import (
    BOUNDARY_BASE,
    LOWER,
    RETIRED_KEPT,
    UPPER,
    Boundaries,
    SplitBlocks,
)
from coordinator.runtime.persist import from_checkpoint, to_checkpoint
from nn.layersplit import boundary_of, join_params, split_spec
from protocol import messages as m
from storage.store import CheckpointStore
from testkit.loopback import Loopback
from tests.coordinator.coord_helpers import digits

WIDTHS = [64, 64, 32, 10]


def split_job(**over: object) -> dict:
    job: dict = {
        "model": {"widths": WIDTHS},
        "data": {"shards": 8, "batch": 16},
        "strategy": {"name": "decentral-async", "tau": 10, "lr": 0.1, "window": 1},
        "eval": {"every_versions": 10},
        "stop": {"target_accuracy": 0.95, "max_versions": 2000},
        "split": {"cut": 1},
    }
    for k, v in over.items():
        job[k] = {**job.get(k, {}), **v}  # type: ignore[dict-item]
    return job


def tasks_sent(lb: Loopback) -> dict[str, list[m.Task]]:
    """Every task message the core sent, by client."""
    out: dict[str, list[m.Task]] = {}
    for o in lb.outputs:
        if isinstance(o, ev.Send) and o.frame[:40].find(b"task") >= 0:
            msg = m.decode(o.frame)
            if isinstance(msg, m.Task):
                out.setdefault(o.client_id, []).append(msg)
    return out


def run(job: dict, clients: dict[str, Capabilities], *, seed: int = 1) -> tuple:
    core = build_core(parse_job(job), seed=seed, dataset=digits())
    lb = Loopback(core)
    for name, caps in clients.items():
        lb.add_client(name, caps=caps)
    lb.run(until=1e4)
    return core, lb


@pytest.mark.parametrize("codec", ["fp32", "int8"])
def test_two_clients_train_both_blocks_to_95_percent_and_never_hold_the_model(codec: str) -> None:
    """With int8 uploads the boundary travels in int8 too (a scale per row)."""
    job = split_job(codecs={"update": codec})
    core, lb = run(job, {"a": Capabilities(flops=1e8), "b": Capabilities(flops=2e8)})
    fin = core.finished
    assert fin is not None and fin.reason == "target_accuracy", fin
    sent = tasks_sent(lb)
    job_shards = {s.sha256 for s in core.data.shards}
    for tasks in sent.values():
        kinds = {tuple(t.spec.widths) for t in tasks}
        assert kinds == {(64, 64, 10), (64, 32, 10)}  # each client trained both blocks
        for t in tasks:
            if t.boundary is not None:  # lower: the block and its head, on a job shard
                assert t.spec.widths == (64, 64, 10) and t.boundary == 1
                assert t.data in job_shards
            else:  # upper: on a shard of boundary activations
                assert t.spec.widths == (64, 32, 10) and t.data not in job_shards
    # the core's model is the joined blocks: its evaluation is the whole network's
    assert core.spec.widths == tuple(WIDTHS)
    # boundary shards go once trained (after a while: late fetches): none piles up
    assert len(core.data.extra) <= RETIRED_KEPT + parse_job(split_job()).split.waiting + 2


def test_each_client_gets_the_blocks_it_can_train() -> None:
    """A client that does not return boundaries (a browser tab) takes upper tasks
    only; one that does not fetch shards, lower tasks only."""
    clients = {
        "tab": Capabilities(flops=1e8, boundary=False),
        "old": Capabilities(flops=1e8, data=False),
    }
    core, lb = run(split_job(stop={"target_accuracy": None, "max_versions": 60}), clients)
    sent = tasks_sent(lb)
    assert sent["tab"] and all(t.boundary is None for t in sent["tab"])
    assert sent["old"] and all(t.boundary == 1 and t.data is None for t in sent["old"])
    assert core.version == 60


@pytest.mark.parametrize(
    ("lie", "reason"),
    [(lambda h: np.full_like(h, np.nan), "nonfinite"), (lambda h: h * 1000, "norm")],
    ids=["nan", "1000x"],
)
def test_a_lower_result_whose_boundary_is_garbage_is_refused_and_its_sender_closed(
    lie: Callable[[np.ndarray], np.ndarray], reason: str
) -> None:
    """A lower result's boundary trains the upper block: held to a norm check of
    its own, as updates are (the coordinator seeds it with version 0's)."""
    core = build_core(parse_job(split_job(stop={"max_versions": 60})), seed=2, dataset=digits())
    lb = Loopback(core)
    lb.add_client("good", caps=Capabilities(flops=1e8))
    lb.add_client("bad", caps=Capabilities(flops=1e8, data=False))  # lower tasks only

    def lying(out: ComputeOutput) -> ComputeOutput:
        assert out.boundary is not None
        return dataclasses.replace(out, boundary=lie(out.boundary))

    lb.lies["bad"] = lying
    lb.run(until=1e4)
    rejected = [o for o in lb.outputs if isinstance(o, ev.ResultRejected)]
    assert rejected and {(o.client_id, o.reason) for o in rejected} == {("bad", reason)}
    left = [o for o in lb.outputs if isinstance(o, ev.ClientLeft) and o.client_id == "bad"]
    assert left and left[0].reason == "closed: BAD_FIELD"  # after max_rejections
    assert core.version == 60 and np.isfinite(core.params.data).all()  # the honest one went on


def test_the_aux_head_and_block_versions_survive_a_stored_checkpoint(tmp_path: Path) -> None:
    """Through a real SQLite checkpoint store (the aux head is strategy state)."""
    job = parse_job(split_job(stop={"target_accuracy": None, "max_versions": 40}))
    core, _ = run(split_job(stop={"target_accuracy": None, "max_versions": 40}),
                  {"a": Capabilities(flops=1e8)})  # fmt: skip
    with CheckpointStore.open(tmp_path / "split.db") as store:
        store.save(to_checkpoint(job, core.state_dict(), created_at=0.0))
        state = from_checkpoint(store.load_latest())
    again = restore_core(job, state, seed=1, dataset=digits())
    assert again.params.array_equal(core.params)
    assert again.split is not None and core.split is not None
    assert np.array_equal(again.split.aux, core.split.aux)
    assert again.strategy.block_versions == core.strategy.block_versions  # type: ignore[attr-defined]
    assert sum(core.strategy.block_versions) == 40  # type: ignore[attr-defined]


def test_blocks_are_views_of_the_whole_model_and_merge_into_it() -> None:
    spec = parse_job(split_job()).spec
    whole = spec.init_params(0)
    blocks = SplitBlocks(spec, 1, init_seed=0)
    lower, upper = blocks.slice(LOWER, whole), blocks.slice(UPPER, whole)
    below, _ = split_spec(spec, (1,))
    assert lower.spec.widths == (64, 64, 10) and upper.spec.widths == (64, 32, 10)
    n = below.num_params
    joined = join_params(spec, [type(lower)(below, lower.data[:n].copy()), upper])
    assert np.array_equal(joined.data, whole.data)
    assert np.shares_memory(upper.data, whole.data)  # a view: no copy of the block
    before = whole.data.copy()
    blocks.merge(UPPER, whole, np.ones(upper.spec.num_params, np.float32), 0.5)
    assert np.array_equal(whole.data[: below.num_params], before[: below.num_params])
    assert np.allclose(whole.data[below.num_params :], before[below.num_params :] + 0.5)
    aux = blocks.aux.copy()
    blocks.merge(LOWER, whole, np.ones(lower.spec.num_params, np.float32), 2.0)
    assert np.allclose(blocks.aux, aux + 2.0)
    h = boundary_of(lower, 1, digits().X_train[:5])
    assert h.shape == (5, 64) and (h >= 0).all()  # after the ReLU


def test_boundary_shards_wait_in_order_and_the_oldest_unleased_go() -> None:
    ds = digits()
    job = parse_job(split_job(split={"waiting": 2}))
    catalog = DataCatalog.for_job(job, ds)
    b = Boundaries(job.split, catalog, ds.y_train, classes=10)
    rows = catalog.shards[0].rows
    made = [b.add(0, np.full((rows, 64), i, np.float32)) for i in range(3)]
    assert [s.index for s in made] == [BOUNDARY_BASE, BOUNDARY_BASE + 1, BOUNDARY_BASE + 2]
    assert b.waiting == 2  # the first was pushed out by the third...
    assert catalog.by_hash[made[0].sha256] is made[0]  # ...and is still served a while
    first = b.take()
    assert first == BOUNDARY_BASE + 1
    b.lost(first)  # its task lost its lease: it waits again, first in line
    assert b.take() == first
    b.trained(first)
    assert len(b) == 1 and b.take() == BOUNDARY_BASE + 2 and b.take() is None
    # retired shards are served until RETIRED_KEPT newer ones retired after them
    for i in range(RETIRED_KEPT):
        b.trained(b.add(1, np.full((catalog.shards[1].rows, 64), i, np.float32)).index)
    assert made[0].sha256 not in catalog.by_hash and first not in catalog.extra
    assert len(catalog.extra) == RETIRED_KEPT + 1  # and the one still leased


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"split": {"cut": 3}}, "split.cut: a hidden layer 1..2"),
        ({"strategy": {"window": "auto"}}, "window = 1"),
        ({"strategy": {"name": "decentral-sync", "clients_per_round": 2}}, "decentral-async"),
        ({"submodel": {"mode": "random"}}, "not with submodel.mode"),
        ({"codecs": {"error_feedback": True, "update": "int8"}}, "codecs.error_feedback"),
        ({"codecs": {"update": "topk:0.01+int8"}}, "use a dense codec"),
    ],
)
def test_a_split_job_that_cannot_work_is_refused_by_name(over: dict, says: str) -> None:
    with pytest.raises((JobConfigError, ValueError), match=says.replace(".", r"\.")):
        parse_job(split_job(**over))


def test_the_example_job_is_a_split_job() -> None:
    from pathlib import Path

    from coordinator.core.config import load_job

    job = load_job(Path(__file__).parents[2] / "examples/layer-split/job.toml")
    assert job.split.cut == 1 and job.spec.widths == (64, 128, 128, 10)
