"""Checkpoints of a model trained by sub-model tasks write only the neuron groups
that changed (coordinator/runtime/snapshots.py), and a restart restores the same model,
also when the model lives in a mapped file."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from coordinator.core import events as ev
from coordinator.core.config import parse_job
from coordinator.runtime import snapshots
from coordinator.runtime.service import CoreService
from coordinator.runtime.snapshots import Snapshots
from nn.changes import ChangedRows
from nn.params import plan_groups
from nn.spec import ModelSpec
from nn.subnet import Subnet
from protocol import messages as m
from storage import CheckpointStore, StoreLimits
from tests.coordinator.coord_helpers import result_messages

WIDTHS = [64, 512, 512, 10]
JOB = {
    "model": {"widths": WIDTHS},
    "data": {"shards": 4, "batch": 8},
    "strategy": {"name": "decentral-async", "tau": 2, "window": 1},
    "submodel": {"mode": "ist", "fraction": 1 / 32, "group": 8},
    "eval": {"every_versions": 1000},
}
#: 16 kB chunks: 7 neurons of the second hidden layer per group, 73 groups
LIMITS = StoreLimits(max_chunk_bytes=1 << 14)


class Tasks:
    """A sink that keeps the tasks sent to clients."""

    def __init__(self) -> None:
        self.tasks: list[m.Task] = []
        self.changed = threading.Condition()

    def __call__(self, outputs: list[ev.Output]) -> None:
        with self.changed:
            for o in outputs:
                if isinstance(o, ev.Send) and isinstance(o.message, m.Task):
                    self.tasks.append(o.message)
            self.changed.notify_all()

    def next(self, n: int) -> m.Task:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.tasks) >= n, 10)
            return self.tasks[n - 1]


def _train(store: Path, results: int, **kw) -> np.ndarray:
    """``results`` sub-model results through a service; the model it stopped with."""
    sink, rng = Tasks(), np.random.default_rng(results)
    service = CoreService(
        parse_job(JOB), store=store, durable_interval=1e4, store_limits=LIMITS, **kw
    )
    with service:
        service.add_sink(sink)
        service.submit_connect("a", m.Hello(client="a"))
        for n in range(1, results + 1):
            task = sink.next(n)
            update = rng.standard_normal(task.spec.num_params).astype(np.float32) * 1e-2
            for msg in result_messages(task, update):
                service.submit_receive("a", msg, len(m.encode(msg)))
            if n % 2 == 0:  # after the result: the inbox keeps their order
                assert service.checkpoint_now().result(10) == n
        service.call(lambda core: None).result(10)  # every result handled
    assert service.core is not None
    return service.core.params.data.copy()


@pytest.mark.parametrize(
    ("mapped", "keep", "copy_max"), [(False, 0, None), (True, 3, None), (True, 0, 0)]
)
def test_checkpoints_after_the_first_write_what_changed_and_restore_exactly(
    tmp_path: Path, mapped: bool, keep: int, copy_max: int | None, monkeypatch
) -> None:
    """Kept whole (keep 0) the history shows one whole checkpoint and patches;
    pruned to the last 3, the patches still restore (their base's chunks stay).
    A mapped model's patches are copies, or (above ``COPY_MAX_BYTES``: 0 here)
    views of the file written on the core thread."""
    if copy_max is not None:
        monkeypatch.setattr(snapshots, "COPY_MAX_BYTES", copy_max)
    store = tmp_path / "job.db"
    final = _train(store, 8, mapped=mapped, keep_checkpoints=keep)
    assert (tmp_path / "job.db.params").exists() == mapped
    with CheckpointStore.open(store, readonly=True) as s:
        infos = s.list()
    patches = [i for i in infos if i.base is not None]
    model_bytes = ModelSpec(widths=tuple(WIDTHS)).nbytes
    assert len(patches) >= 3 and all(p.nbytes < model_bytes / 2 for p in patches), infos
    if keep == 0:
        assert [i.base is None for i in infos] == [True] + [False] * len(patches)
        assert infos[0].nbytes >= model_bytes
    if mapped:  # the first checkpoint is version 0, written from the file at start
        assert keep or infos[0].version == 0
    # A restart restores the model the first run stopped with, bit for bit.
    sink = Tasks()
    with CoreService(parse_job(JOB), store=store, mapped=mapped, store_limits=LIMITS) as service:
        service.add_sink(sink)
        restored = service.call(lambda core: core.params.data.copy()).result(10)
        assert service.stats.restored_from == max(i.version for i in infos)
    np.testing.assert_array_equal(restored, final)


def _subnet(spec: ModelSpec, lo: int) -> Subnet:
    return Subnet(spec, tuple(np.arange(lo, lo + 4) for _ in spec.widths[1:-1]))


def test_each_patch_holds_the_groups_changed_since_the_snapshot_before() -> None:
    spec = ModelSpec(widths=(8, 64, 4))
    plan = plan_groups(spec, 9 * 8)  # 8 rows of the hidden layer per group, 1 output row
    out = list(range(8, 12))  # the output layer's groups: every subnet holds them
    params = spec.init_params(0)
    changed = ChangedRows(spec)
    snaps = Snapshots(spec, plan)
    assert snaps.take(1, params, changed) == (None, False)  # nothing stored yet: whole
    changed.mark(_subnet(spec, 0))  # hidden rows 0..3: group 0, and the output layer
    first, _ = snaps.take(2, params, changed)  # on v1, written before it
    assert first is not None and first.base == 1 and sorted(first.groups) == [0, *out]
    changed.mark(_subnet(spec, 40))  # group 5
    second, _ = snaps.take(3, params, changed)
    assert second is not None and second.base == 2 and sorted(second.groups) == [5, *out]
    assert snaps.take(3, params, changed)[0].groups == {}  # nothing moved since
    snaps.written(2, "failed")  # the chain broke: v3 will find no base; the next is whole
    changed.mark(_subnet(spec, 8))
    assert snaps.take(4, params, changed) == (None, False)
    changed.mark(None)  # a step that moved anything: whole again
    assert snaps.take(5, params, changed, mapped=True) == (None, True)  # from the file
    snaps.restored(9, changed)
    assert snaps.take(10, params, changed)[0].base == 9


def test_changed_rows_map_to_the_groups_that_hold_them() -> None:
    spec = ModelSpec(widths=(8, 64, 32, 4))
    plan = plan_groups(spec, 72)  # per group: 8 rows of layer 0, 1 of layer 1, 2 outputs
    rows = ChangedRows(spec, everything=False)
    assert rows.groups(plan) == [] and rows.fraction() == 0.0
    rows.mark(Subnet(spec, (np.array([9, 10]), np.array([31]))))
    marked = rows.groups(plan)
    got = [(plan[i].layer, plan[i].row_start) for i in marked]
    assert got == [(0, 8), (1, 31), (2, 0), (2, 2)]  # every output row moves with a subnet
    assert rows.fraction() == (2 + 1 + 4) / (64 + 32 + 4)
    taken = rows.take()
    assert taken.groups(plan) == marked and rows.groups(plan) == []
    union = ChangedRows(spec, everything=False)
    union.mark(Subnet(spec, (np.array([0]), np.array([0]))))
    union.update(taken)
    assert [plan[i].row_start for i in union.groups(plan) if plan[i].layer < 2] == [0, 8, 0, 31]
    union.update(ChangedRows(spec))  # a tracker that saw everything
    assert union.everything and union.groups(plan) == list(range(len(plan)))
