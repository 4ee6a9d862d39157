"""coordinator.core.upstream: an edge takes each root model as it is and sends every
unit of its crowd's progress exactly once (again when refused); its standing
survives a checkpoint, and the core takes a new model as one more version."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.core import events as ev
from coordinator.core.assembly import restore_core
from coordinator.core.machine import Coordinator
from coordinator.core.upstream import UpstreamState, rebase, sync
from coordinator.runtime.persist import from_checkpoint, to_checkpoint
from nn.params import Params
from tests.coordinator.coord_helpers import (
    acks,
    deliver,
    digits,
    hello,
    make_core,
    only,
    result_messages,
    task_of,
)


def edge() -> Coordinator:
    core = make_core()
    core.upstream = UpstreamState()
    return core


class Crowd:
    """One client of the edge whose every result is accepted."""

    def __init__(self, core: Coordinator, now: float = 0.0) -> None:
        self.core = core
        self.task = task_of(core.connect("a", hello("a"), now), "a")

    def train(self, value: float, now: float) -> None:
        update = np.full(self.core.params.num_params, value, np.float32)
        out = deliver(self.core, "a", result_messages(self.task, update), now)
        assert acks(out, "a") == [(self.task.task_id, True, "")]
        self.task = task_of(out, "a")


def root_model(core: Coordinator, shift: float) -> Params:
    init = core.spec.init_params(core.job.model.init_seed).data
    return Params.from_flat(core.spec, (init + np.float32(shift)).astype(np.float32))


def test_the_edge_takes_the_root_model_and_carries_its_unsent_progress() -> None:
    core = edge()
    init = core.spec.init_params(core.job.model.init_seed).data
    Crowd(core).train(0.01, 1.0)  # the root unreachable: the crowd trains alone
    progress = core.params.data - init
    assert np.abs(progress).max() > 0
    v = core.version
    g = root_model(core, 0.5)
    version, out = rebase(core, g, 7, 3.0, accepted=set())
    assert version == v + 1 == core.version
    assert np.array_equal(core.params.data, g.data)  # not g + progress: no overshoot
    assert [o.version for o in only(out, ev.ModelUpdated)] == [v + 1]
    assert core.upstream is not None and core.upstream.root_version == 7
    assert np.array_equal(core.upstream.base, g.data)
    # everything trained alone goes up with the first sync
    np.testing.assert_allclose(sync(core, "t1"), progress, rtol=1e-6, atol=1e-7)


def test_progress_goes_up_once_when_accepted_and_again_when_refused() -> None:
    core = edge()
    crowd = Crowd(core)
    g1 = root_model(core, 0.0)
    rebase(core, g1, 0, 1.0, accepted=set())
    crowd.train(0.01, 2.0)
    first = sync(core, "t1")
    assert np.abs(first).max() > 0
    np.testing.assert_allclose(first, core.params.data - g1.data)
    at_sync = core.params.data.copy()

    # The crowd goes on while the upload is in flight.
    crowd.train(0.02, 3.0)
    later = core.params.data - at_sync

    # Accepted: the root has ``first``; only what came after it is carried.
    g2 = root_model(core, 0.25)
    rebase(core, g2, 1, 4.0, accepted={"t1"})
    assert np.array_equal(core.params.data, g2.data)
    again = sync(core, "t2")
    np.testing.assert_allclose(again, later, rtol=1e-6, atol=1e-7)

    # Refused (or lost): the root does not have ``again``; it goes up once more,
    # with what the crowd did since.
    crowd.train(0.03, 5.0)
    since = core.params.data - g2.data
    g3 = root_model(core, 0.5)
    rebase(core, g3, 2, 6.0, accepted=set())
    np.testing.assert_allclose(sync(core, "t3"), later + since, rtol=1e-5, atol=1e-6)


def test_an_unchanged_model_is_no_new_version() -> None:
    core = edge()
    g = core.params.copy()
    version, out = rebase(core, g, 0, 1.0, accepted=set())
    assert version == 0 and out == []


def test_upstream_state_survives_a_checkpoint() -> None:
    core = edge()
    crowd = Crowd(core)
    rebase(core, root_model(core, 0.1), 3, 1.0, accepted=set())
    crowd.train(0.01, 2.0)
    sync(core, "t9")
    crowd.train(0.01, 3.0)
    state = from_checkpoint(to_checkpoint(core.job, core.state_dict(), created_at=0.0))
    back = restore_core(core.job, state, dataset=digits())
    assert back.upstream is not None and core.upstream is not None
    assert back.upstream.root_version == 3 and back.upstream.syncs == 1
    assert np.array_equal(back.upstream.base, core.upstream.base)
    assert list(back.upstream.inflight) == ["t9"]
    # the restored edge still knows what the root was sent, and what it was not
    expect = core.params.data - core.upstream.inflight["t9"]
    rebase(back, root_model(back, 0.2), 4, 4.0, accepted={"t9"})
    np.testing.assert_allclose(sync(back, "t10"), expect, atol=1e-7)
    # a coordinator that is no edge has no upstream state in its checkpoint
    assert "upstream" not in make_core().state_dict()


def test_clients_holding_the_old_version_keep_contributing_after_a_rebase() -> None:
    core = edge()
    task = task_of(core.connect("a", hello("a"), 0.0), "a")
    rebase(core, root_model(core, 0.3), 0, 1.0, accepted=set())
    out = deliver(core, "a", result_messages(task), 2.0)
    assert acks(out, "a") == [(task.task_id, True, "")]
    assert task_of(out, "a").model_version == core.version


def test_a_replaced_model_is_judged_by_updates_to_it_not_to_the_old_one() -> None:
    """After a rebase far from the edge's model, its players' honest updates were
    refused for their norm beside the old model's small ones, and the edge closed
    them (tests/e2e/test_federation.py, 2 runs in 3 once its rounds were fast)."""
    core = edge()
    before = list(core.validator.reference)  # the job's reference tasks, at v0
    assert before
    core.validator.norms.extend([1e-4] * 30)  # a converged model: tiny updates
    rng = np.random.default_rng(0)
    far = core.params.data + rng.normal(0, 0.3, core.params.data.shape).astype(np.float32)
    core.replace_model(far, 1.0)
    assert not core.validator.norms  # the old model's norms are forgotten
    ref = core.validator.reference
    assert len(ref) == len(before) and ref != before  # measured on the new model
    # an update to the new model the size of the coordinator's own passes
    size = float(np.median(ref)) / np.sqrt(core.spec.num_params)
    assert core.validator.check(np.full(core.spec.num_params, size, np.float32))[0] is None


def test_a_foreign_or_broken_model_is_refused() -> None:
    core = edge()
    other = make_core(model={"widths": [64, 32, 10]})
    with pytest.raises(ValueError, match=r"\[64, 32, 10\] is not this edge's \[64, 16, 10\]"):
        rebase(core, other.params, 0, 1.0, accepted=set())
    bad = core.params.data.copy()
    bad[3] = np.nan
    with pytest.raises(ValueError, match="not finite"):
        core.replace_model(bad, 1.0)
    with pytest.raises(ValueError, match="values, the model has"):
        core.replace_model(bad[:10], 1.0)
    with pytest.raises(RuntimeError, match="no root model"):
        sync(core, "t1")
