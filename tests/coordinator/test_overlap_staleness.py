"""strategy.staleness.count = "overlap": a sub-model result is as stale as the
merges that touched its own neurons (coordinator/core/strategies/overlap.py)."""

import numpy as np
import pytest

from coordinator.core.config import DataSection, JobConfigError, StrategySection, parse_job
from coordinator.core.leases import LeaseBook
from coordinator.core.strategies import ClientView, ModelState, make_strategy
from coordinator.core.strategies.overlap import OverlapClock
from nn.spec import ModelSpec
from nn.subnet import Subnet
from storage import Checkpoint
from storage.layout import decode, encode, parse_manifest, seal, sha256_hex

SPEC = ModelSpec(widths=(3, 8, 8, 2))
LOW = (np.arange(4), np.arange(4))  # the first half of each hidden layer
HIGH = (np.arange(4, 8), np.arange(4, 8))  # the other half: no neuron shared


def build(**cfg):
    model = ModelState(params=SPEC.init_params(0))
    cfg = {"window": 1, "staleness": {"kind": "polynomial", "a": 1.0, "count": "overlap"}} | cfg
    s = make_strategy(
        model=model,
        config=StrategySection(name="decentral-async", **cfg),
        data=DataSection(shards=4, batch=4),
        rng=np.random.default_rng(0),
    )
    return s, model


def lease(s, book: LeaseBook, model: ModelState, keep) -> object:
    task = book.new_task(
        s.task_for(ClientView(client_id="a", version_held=None, connected=4), 0),
        version=model.version,
        now=0,
    )
    task.subnet = Subnet(SPEC, keep, 0.5)
    s.on_task_created(task)
    return task


def ones(task) -> np.ndarray:
    return np.ones(task.subnet.sub.num_params, np.float32)


@pytest.mark.parametrize("count", ["versions", "overlap"])
def test_merges_elsewhere_leave_a_slice_fresh(count: str) -> None:
    """Three merges on the other half: 3 versions, but none touched the slice, so
    with overlap it takes the whole step (polynomial a=1: 1/(1+s))."""
    s, model = build(staleness={"kind": "polynomial", "a": 1.0, "count": count})
    book = LeaseBook()
    mine = lease(s, book, model, LOW)
    for _ in range(3):
        assert s.on_result(lease(s, book, model, HIGH), ones(mine), 1).accepted
    before = model.params.data.copy()
    out = s.on_result(mine, ones(mine), 2)
    want = 0 if count == "overlap" else 3
    assert out.accepted and out.staleness == want and model.version == 4
    moved = model.params.data - before
    expect = np.zeros_like(before)
    mine.subnet.add_to(
        type(model.params).from_flat(SPEC, expect, copy=False),
        ones(mine),
        s.config.alpha / (1 + want),
    )
    np.testing.assert_allclose(moved, expect, rtol=1e-5, atol=1e-7)


def test_overlap_counts_the_merges_on_the_slice_and_unseen_versions() -> None:
    s, model = build()
    book = LeaseBook()
    mine = lease(s, book, model, LOW)
    s.on_result(lease(s, book, model, LOW), ones(mine), 1)  # every neuron of it
    s.on_result(lease(s, book, model, HIGH), ones(mine), 1)  # none
    assert s.staleness_of(mine) == 1
    model.version += 2  # versions the clock did not see step: every neuron
    assert s.staleness_of(mine) == 3
    assert s.on_result(mine, ones(mine), 2).staleness == 3


def test_max_staleness_counts_overlap() -> None:
    s, model = build(max_staleness=1)
    book = LeaseBook()
    mine = lease(s, book, model, LOW)
    for _ in range(3):
        s.on_result(lease(s, book, model, HIGH), ones(mine), 1)
    assert s.on_result(mine, ones(mine), 2).accepted  # 3 versions, none on its neurons


def test_fedbuff_steps_count_the_buffers_neurons_once() -> None:
    s, model = build(aggregation="fedbuff", buffer_k=2)
    book = LeaseBook()
    mine = lease(s, book, model, LOW)
    a, b = lease(s, book, model, LOW), lease(s, book, model, HIGH)
    s.on_result(a, ones(a), 1)
    assert s.on_result(b, ones(b), 1).step is not None and model.version == 1
    assert s.staleness_of(mine) == 1


def test_the_clock_survives_a_checkpoint() -> None:
    s, model = build()
    book = LeaseBook()
    mine = lease(s, book, model, LOW)
    s.on_result(lease(s, book, model, LOW), ones(mine), 1)
    for _ in range(2):
        s.on_result(lease(s, book, model, HIGH), ones(mine), 1)
    ckpt = Checkpoint(version=3, created_at=0.0, params=model.params, strategy=s.state_dict())
    manifest, chunks = encode(ckpt, 4096)  # through the store's layout, as a checkpoint is
    blob, digest = seal(manifest, [sha256_hex(*c) for c in chunks])
    stored = [b"".join(bytes(p) for p in c) for c in chunks]
    back = decode(3, parse_manifest(3, blob, digest), iter(enumerate(stored)))
    clone, cmodel = build()
    cmodel.version = model.version
    clone.load_state_dict(back.strategy)
    assert clone.staleness_of(mine) == s.staleness_of(mine) == 1
    fresh, fmodel = build()
    fmodel.version = model.version
    state = {k: v for k, v in s.state_dict().items() if not k.startswith("overlap_")}
    fresh.load_state_dict(state)  # an older checkpoint: its tasks count versions
    assert fresh.staleness_of(mine) == 3


def test_a_model_without_hidden_layers_counts_versions() -> None:
    clock = OverlapClock(ModelSpec(widths=(3, 2)))
    task = LeaseBook().new_task(
        make_strategy(
            model=ModelState(params=ModelSpec(widths=(3, 2)).init_params(0)),
            config=StrategySection(),
            data=DataSection(shards=2, batch=4),
            rng=np.random.default_rng(0),
        ).new_plan(),
        version=0,
        now=0,
    )
    clock.created(task)
    clock.step_one(None)
    assert clock.staleness(task, 5) == 5


def test_the_job_file_names_the_field() -> None:
    assert StrategySection().staleness.count == "versions"
    with pytest.raises(JobConfigError, match=r"strategy\.staleness\.count"):
        parse_job({"strategy": {"staleness": {"count": "neurons"}}})
    with pytest.raises(JobConfigError, match=r"staleness\.count 'overlap': needs decentral-async"):
        parse_job({"strategy": {"name": "central-async", "staleness": {"count": "overlap"}}})
