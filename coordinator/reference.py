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

from nn.data import Dataset
from nn.optim import Optimizer, OptState
from nn.params import Params
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
) -> list[float]:
    """L2 norms of ``count`` updates computed as clients would, on the first shards."""
    rng = np.random.default_rng([seed, 0x5EF])
    norms = []
    for shard in shards[:count]:
        X, y = dataset.X_train[shard], dataset.y_train[shard]
        if kind == "gradient":
            rows = batch_indices(X.shape[0], 1, min(steps * batch, X.shape[0]), rng)
            _, grad = compute_gradient(params, X[rows], y[rows])
            u = grad.data
        else:
            local = params.copy()
            opt = Optimizer.from_dict(optimizer)
            train_steps(local, OptState.init(opt, params.spec), X, y, steps, batch, rng)
            u = local.data - params.data
        norms.append(math.sqrt(float(u.astype(np.float64) @ u.astype(np.float64))))
    return norms
