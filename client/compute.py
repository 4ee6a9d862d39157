"""Run one task with the nn core: the only place a client turns a task into numbers.

Shared by the desktop client (on a worker thread), the simulator and the tests,
so every driver computes exactly the same update for the same task. A task
names its rows either by hash (``task.data``: the rows of that shard file,
docs/protocol.md §13, optionally narrowed by ``indices``) or, for a peer that
does not fetch shards, as ``task.dataset`` (``"<name>#<split seed>"``, see
:func:`dataset_ref`) plus ``indices`` into that dataset's training split; its
batch sampling as ``seed``. The result is deterministic given those and the
base params, and the same in any conforming client: batches come from the
portable generator ``Xoshiro128ss(task.seed, 0)`` (docs/protocol.md §12, which
states every formula used here).

- ``gradient``: the mean-loss gradient on ``steps × batch`` samples drawn
  without replacement from the shard;
- ``train``: ``steps`` local optimizer steps from the base params, with fresh
  optimizer state; the update is the delta ``local − base``.
- ``distill``: the same, but each step follows ``compression.distill``'s loss
  toward the task's ``teacher_logits`` (rows aligned with ``indices``).
- ``evaluate``: loss and accuracy of the base params on all of the task's rows;
  no update.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from compression.distill import distill_steps
from nn.data import Dataset, load_dataset
from nn.optim import Optimizer, OptState
from nn.params import Params
from nn.rng import Xoshiro128ss
from nn.train import batch_indices, compute_gradient, evaluate, train_steps
from protocol import messages as m
from protocol.shardfile import ShardData


def dataset_ref(name: str, seed: int) -> str:
    """The ``task.dataset`` string: the dataset name and its train/test split seed."""
    return f"{name}#{seed}"


@functools.lru_cache(maxsize=4)
def load_ref(ref: str) -> Dataset:
    """Load (once per process) the dataset a task names."""
    name, sep, seed = ref.rpartition("#")
    if not sep:
        return load_dataset(ref)
    try:
        return load_dataset(name, seed=int(seed))
    except ValueError as exc:
        raise ValueError(f"task.dataset {ref!r}: {exc}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeOutput:
    update: np.ndarray  # flat float32, the model's size
    loss: float
    samples: int
    steps: int
    #: ``result.metrics``: ``{"accuracy": ...}`` for ``evaluate``
    metrics: dict[str, float] = field(default_factory=dict)


#: The task seed's generator stream for batch sampling (docs/protocol.md §12.1;
#: stream 1 is stochastic rounding, ``client.session.ROUNDING_STREAM``).
SAMPLING_STREAM = 0


def sampling_rng(task: m.Task) -> Xoshiro128ss:
    """The generator a task's batches come from: stream 0 of ``task.seed``."""
    return Xoshiro128ss(task.seed, SAMPLING_STREAM)


def task_rows(task: m.Task, data: Dataset | ShardData | None) -> tuple[np.ndarray, np.ndarray]:
    """The rows ``indices`` pick from: the shard a task names, or the training split."""
    if task.data is not None:
        if not isinstance(data, ShardData):
            raise ValueError(f"task {task.task_id}: names shard {task.data}, which is not here")
        return data.X, data.y
    if isinstance(data, ShardData):
        raise ValueError(f"task {task.task_id}: names no shard, a shard was given")
    ds = data if data is not None else load_ref(task.dataset)
    return ds.X_train, ds.y_train


def run_task(task: m.Task, base: Params, data: Dataset | ShardData | None = None) -> ComputeOutput:
    """Compute the task's update from ``base`` (left untouched). ``data``: the
    task's shard (``task.data``), or the named dataset (loaded when None)."""
    X, y = task_rows(task, data)
    if task.indices is not None:
        idx = task.indices.astype(np.int64)
        if idx.size == 0 or int(idx.max()) >= X.shape[0]:
            raise ValueError(f"task {task.task_id}: shard indices out of range 0..{X.shape[0]}")
        X, y = X[idx], y[idx]
    if task.kind == "evaluate":
        r = evaluate(base, X, y)
        return ComputeOutput(
            update=np.zeros(0, np.float32),
            loss=r.loss,
            samples=r.n,
            steps=0,
            metrics={"accuracy": r.accuracy},
        )
    rng = sampling_rng(task)
    if task.kind == "gradient":
        rows = batch_indices(X.shape[0], 1, min(task.steps * task.batch, X.shape[0]), rng)
        loss, grad = compute_gradient(base, X[rows], y[rows])
        return ComputeOutput(update=grad.data, loss=loss, samples=rows.size, steps=1)
    if task.kind in ("train", "distill"):
        local = base.copy()
        opt = Optimizer.from_dict(task.optimizer) if task.optimizer else Optimizer()
        state = OptState.init(opt, base.spec)
        if task.kind == "train":
            metrics = train_steps(local, state, X, y, task.steps, task.batch, rng)
        else:
            if task.teacher_logits is None or task.teacher_logits.shape[0] != X.shape[0]:
                raise ValueError(f"task {task.task_id}: teacher_logits do not match the samples")
            metrics = distill_steps(
                local, state, X, task.teacher_logits.astype(np.float32), y,
                steps=task.steps, batch=task.batch, temperature=task.temperature,
                alpha=task.distill_alpha, rng=rng,
            )  # fmt: skip
        delta = local.data - base.data
        return ComputeOutput(
            update=delta, loss=metrics.loss, samples=metrics.samples, steps=metrics.steps
        )
    raise ValueError(f"task {task.task_id}: kind {task.kind!r} is not computed by this client")
