"""The coordinator's own reference updates: what an honest result looks like.

The norm check (validation.py) compares each update with the median of recent
ones. Trusting the first results to set that median let a single client's
first upload (1000.0 in every weight) through and ruin the model. The
coordinator holds the training data itself, so before any client answers it
computes a few tasks of the job's own kind (tau local steps, or one gradient)
from version 0 and seeds the median with their norms: the check bites from the
very first result. Pure and seeded: the same job and seed give the same norms.
"""

from __future__ import annotations

import math

import numpy as np

from coordinator.core.config import JobConfig
from coordinator.core.layersplit import BOUNDARY, LOWER, UPPER, SplitBlocks
from coordinator.core.submodel import SubmodelPlanner
from nn.data import Dataset
from nn.layersplit import boundary_of
from nn.optim import Optimizer, OptState
from nn.params import Params
from nn.subnet import Subnet
from nn.train import batch_indices, compute_gradient, train_steps


def reference_norms(
    params: Params,
    dataset: Dataset,
    shards: list[np.ndarray],
    *,
    kind: str,
    steps: int,
    batch: int,
    optimizer: dict,
    seed: int,
    count: int = 3,
    subnets: list[Subnet] | None = None,
    inputs: list[np.ndarray] | None = None,
) -> list[float]:
    """L2 norms of ``count`` updates computed as clients would, on the first shards,
    per local step (validation.py compares norms per step: tasks differ in steps);
    with ``subnets`` (a sub-model job) each trains its slice, as its clients do:
    the norms are a slice's, and no copy of a model too big to copy is made.
    ``inputs``: what each task takes instead of its shard's rows, one array per
    shard in order (a layer-split upper block trains on the lower block's
    boundary activations)."""
    rng = np.random.default_rng([seed, 0x5EF])
    norms = []
    for i, shard in enumerate(shards[:count]):
        X, y = dataset.X_train[shard], dataset.y_train[shard]
        if inputs is not None:
            X = inputs[i]
        if kind == "gradient":
            rows = batch_indices(X.shape[0], 1, min(steps * batch, X.shape[0]), rng)
            _, grad = compute_gradient(params, X[rows], y[rows])
            u = grad.data
        else:
            start = params if subnets is None else subnets[i % len(subnets)].slice(params)
            local = start.copy()
            opt = Optimizer.from_dict(optimizer)
            train_steps(local, OptState.init(opt, start.spec), X, y, steps, batch, rng)
            u = local.data - start.data
        norm = math.sqrt(float(u.astype(np.float64) @ u.astype(np.float64)))
        norms.append(norm / (steps if kind == "train" else 1))
    return norms


def job_reference_norms(
    job: JobConfig,
    params: Params,
    dataset: Dataset,
    shards: list[np.ndarray],
    *,
    local: bool,
    optimizer: dict,
    seed: int,
    seq: np.random.SeedSequence,
) -> list[float]:
    """The norm check's yardstick for a whole-model or sub-model job: the job's own
    kind of task (``local`` steps or one gradient), on slices where clients train
    slices (drawn from ``seq``, as the first sub-model choices are)."""
    st = job.strategy
    if not job.validation.reference_tasks:
        return []
    subnets = None
    if job.submodel.enabled:  # the reference trains slices, as clients do
        chooser = SubmodelPlanner(
            job.submodel,
            params.spec,
            model_codec=job.codecs.model,
            update_codec=job.codecs.update,
            rng=np.random.default_rng(seq.spawn(1)[0]),
        )
        samples = st.nominal_tau * job.data.batch
        subnets = [
            chooser.choose(bytes_per_s=None, flops_per_s=None, samples=samples)
            for _ in range(job.validation.reference_tasks)
        ]
    # Norms are judged per step, and an update does not grow linearly with its
    # steps: on a wide model 10 steps moved it 2.60 and 224 steps 3.27, so a slow
    # client's tau_min tasks read 20x a 224-step yardstick and were refused. Under
    # tau = "auto" the yardstick holds both ends a task is likely to have.
    lengths = [st.nominal_tau] if local else [1]
    if local and st.tau == "auto" and st.tau_min < st.nominal_tau:
        lengths.insert(0, st.tau_min)
    norms: list[float] = []
    for steps in lengths:
        norms += reference_norms(
            params,
            dataset,
            shards,
            kind="train" if local else "gradient",
            steps=steps,
            batch=job.data.batch,
            optimizer=optimizer,
            seed=seed,
            count=job.validation.reference_tasks,
            subnets=subnets,
        )
    return norms


def split_reference_norms(
    job: JobConfig,
    split: SplitBlocks,
    params: Params,
    dataset: Dataset,
    shards: list[np.ndarray],
    *,
    optimizer: dict,
    seed: int,
) -> dict[int, list[float]]:
    """A layer-split job's yardsticks by block: each block's from the coordinator's
    own updates to it (lower tasks on the first shards, upper tasks on their
    boundaries), the boundary's from the first shards' boundaries under version 0."""
    count = job.validation.reference_tasks
    if not count:
        return {}
    lower = split.slice(LOWER, params)
    # the first shards' boundaries: the boundary check's yardstick, and what the
    # upper block's reference tasks train on
    hs = [boundary_of(lower, split.cut, dataset.X_train[rows]) for rows in shards[:count]]
    norms = {BOUNDARY: [float(np.linalg.norm(h)) for h in hs]}
    for block in (LOWER, UPPER):
        norms[block] = reference_norms(
            lower if block == LOWER else split.slice(UPPER, params),
            dataset,
            shards,
            kind="train",
            steps=job.strategy.nominal_tau,
            batch=job.data.batch,
            optimizer=optimizer,
            seed=seed,
            count=count,
            inputs=None if block == LOWER else hs,
        )
    return norms
