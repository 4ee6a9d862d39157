"""Run one task with the nn core: the only place a client turns a task into numbers.

Shared by the desktop client (on a worker thread), the simulator and the tests, so every driver
computes exactly the same update for the same task. A task names its rows either by hash
(``task.data``: the rows of that shard file, docs/protocol.md §13, optionally narrowed by
``indices``) or, for a peer that does not fetch shards, as ``task.dataset`` (``"<name>#<split
seed>"``, see :func:`dataset_ref`) plus ``indices`` into that dataset's training split; its
batch sampling as ``seed``. The result is deterministic given those and the base params, and
the same in any conforming client: batches come from the portable generator
``Xoshiro128ss(task.seed, 0)`` (docs/protocol.md §12, which states every formula used here).

- ``gradient``: the mean-loss gradient on ``steps × batch`` samples drawn without replacement
  from the shard;
- ``train``: ``steps`` local optimizer steps from the base params, with fresh optimizer state;
  the update is the delta ``local − base``;
- ``distill``: the same, but each step follows ``compression.distill``'s loss toward the task's
  ``teacher_logits`` (rows aligned with ``indices``);
- ``evaluate``: loss and accuracy of the base params on all of the task's rows; no update.

:class:`SlicedTask` computes the same update a few steps at a time, for drivers that must yield
between pieces (a duty cycle, a game's frame budget).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from nn.data import Dataset, load_dataset
from nn.optim import Optimizer, OptState
from nn.params import Params
from nn.rng import Xoshiro128ss
from nn.train import batch_indices, compute_gradient, evaluate, train_steps
from protocol import messages as m
from protocol.shardfile import ShardData

#: the §12 kernel family this module computes with (``hello.kernel``, docs/protocol.md
#: §3.1; ``protocol.messages.KERNELS``): numba kernels, float32 BLAS sums
KERNEL = "numba-f32"


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
    #: a layer-split lower task's boundary: its rows' activations at hidden layer
    #: ``task.boundary`` under the trained block (docs/protocol.md §3.3.2)
    boundary: np.ndarray | None = None


#: The task seed's generator stream for batch sampling (docs/protocol.md §12.1;
#: stream 1 is stochastic rounding, ``client.results.ROUNDING_STREAM``).
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


def task_samples(
    task: m.Task, data: Dataset | ShardData | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The rows a task computes on: ``task_rows`` narrowed by ``task.indices``."""
    X, y = task_rows(task, data)
    if task.indices is not None:
        idx = task.indices.astype(np.int64)
        if idx.size == 0 or int(idx.max()) >= X.shape[0]:
            raise ValueError(f"task {task.task_id}: shard indices out of range 0..{X.shape[0]}")
        X, y = X[idx], y[idx]
    return X, y


def run_task(task: m.Task, base: Params, data: Dataset | ShardData | None = None) -> ComputeOutput:
    """Compute the task's update from ``base`` (left untouched). ``data``: the
    task's shard (``task.data``), or the named dataset (loaded when None)."""
    X, y = task_samples(task, data)
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
            from compression.distill import distill_steps  # distill tasks only

            metrics = distill_steps(
                local, state, X, task.teacher_logits.astype(np.float32), y,
                steps=task.steps, batch=task.batch, temperature=task.temperature,
                alpha=task.distill_alpha, rng=rng,
            )  # fmt: skip
        delta = local.data - base.data
        return ComputeOutput(
            update=delta,
            loss=metrics.loss,
            samples=metrics.samples,
            steps=metrics.steps,
            boundary=_boundary(task, local, X),
        )
    raise ValueError(f"task {task.task_id}: kind {task.kind!r} is not computed by this client")


class _InOrder:
    """Stands in for the rng inside ``train_steps``: its one "permutation" keeps the
    rows in the order given (a piece's batches, drawn up front)."""

    def permutation(self, n: int) -> np.ndarray:
        return np.arange(n)


class SlicedTask:
    """A task computed a few optimizer steps at a time, for drivers that must yield
    between pieces: the desktop client's duty cycle, a game's frame budget.

    ``train`` and ``distill`` tasks slice per step (one mini-batch, the finest
    unit the compiled loop has): the whole task's batches are drawn up front
    exactly as :func:`run_task` draws them, and each piece trains on its rows in
    order, so the update is run_task's bit for bit however it is cut. Other kinds
    (``gradient``, ``evaluate``) are a single piece that :meth:`run` computes whole.

    Call ``run(n)`` until ``finished``, then ``output()``; ``base`` is read, never
    written (the local copy is this object's).
    """

    def __init__(self, task: m.Task, base: Params, data: Dataset | ShardData | None = None) -> None:
        self.task = task
        self._base = base
        self._data = data
        #: pieces in all (steps for train and distill, else 1) and pieces run
        self.steps = task.steps if task.kind in ("train", "distill") else 1
        self.done = 0
        self._whole: ComputeOutput | None = None
        if task.kind not in ("train", "distill"):
            return
        X, y = task_samples(task, data)
        if task.kind == "distill" and (
            task.teacher_logits is None or task.teacher_logits.shape[0] != X.shape[0]
        ):
            raise ValueError(f"task {task.task_id}: teacher_logits do not match the samples")
        self._rows = batch_indices(X.shape[0], task.steps, task.batch, sampling_rng(task))
        self._X, self._y = X, y
        self._teacher = (
            None if task.teacher_logits is None else task.teacher_logits.astype(np.float32)
        )
        self._local = base.copy()
        opt = Optimizer.from_dict(task.optimizer) if task.optimizer else Optimizer()
        self._state = OptState.init(opt, base.spec)
        self._samples = 0
        self._loss_sum = 0.0

    @property
    def finished(self) -> bool:
        return self.done >= self.steps

    @property
    def step_flops(self) -> float:
        """FLOPs of one piece (what a driver sizes its slices by)."""
        t = self.task
        if t.kind in ("train", "distill"):
            return t.spec.flops_per_sample(train=True) * t.batch
        return t.spec.flops_per_sample(train=t.kind == "gradient") * t.steps * t.batch

    def run(self, n: int) -> int:
        """Compute up to ``n`` more pieces; returns how many ran."""
        n = min(int(n), self.steps - self.done)
        if n <= 0:
            return 0
        t = self.task
        if t.kind not in ("train", "distill"):
            self._whole = run_task(t, self._base, self._data)
            self.done = 1
            return 1
        part = self._rows[self.done * t.batch : (self.done + n) * t.batch]
        if t.kind == "train":
            met = train_steps(
                self._local, self._state, self._X[part], self._y[part], n, t.batch, _InOrder()
            )
        else:
            assert self._teacher is not None
            from compression.distill import distill_steps  # distill tasks only

            met = distill_steps(
                self._local, self._state, self._X[part], self._teacher[part], self._y[part],
                steps=n, batch=t.batch, temperature=t.temperature, alpha=t.distill_alpha,
                rng=_InOrder(),
            )  # fmt: skip
        self.done += n
        self._samples += met.samples
        self._loss_sum += met.loss * n
        return n

    def output(self) -> ComputeOutput:
        """The finished task's result (what ``run_task`` returns for it)."""
        if not self.finished:
            raise ValueError(f"task {self.task.task_id}: {self.done} of {self.steps} pieces run")
        if self._whole is not None:
            return self._whole
        return ComputeOutput(
            update=self._local.data - self._base.data,
            loss=self._loss_sum / self.done if self.done else float("nan"),
            samples=self._samples,
            steps=self.done,
            boundary=_boundary(self.task, self._local, self._X),
        )


def _boundary(task: m.Task, local: Params, X: np.ndarray) -> np.ndarray | None:
    """What ``task.boundary`` asks for: every row's activations at that hidden
    layer, in row order, under the block as trained (§3.3.2)."""
    if task.boundary is None:
        return None
    from nn.layersplit import boundary_of  # layer-split tasks only

    return boundary_of(local, task.boundary, X)
