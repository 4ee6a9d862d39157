"""One machine training a job alone: the baseline a crowd is measured against.

``linear_evaluations`` trains the job's model with the job's optimizer on the
whole training set and evaluates it as the job's coordinator would;
``linear_steps_to_target`` is the number of steps it needs to reach an accuracy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np

from coordinator.core.strategies.aggregate import schedule_factor
from nn.data import Dataset
from nn.optim import Optimizer, OptState
from nn.train import evaluate, train_steps


def linear_evaluations(
    job: Any,
    dataset: Dataset,
    *,
    max_steps: int = 20_000,
    lr: float | None = None,
    batch: int | None = None,
    every: int | None = None,
) -> Iterator[tuple[int, Any]]:
    """One machine training the job alone: ``(steps done, evaluation)`` every tau steps.

    The same model, optimizer and batch as the job's clients, trained on the whole
    training set, evaluated on the coordinator's held-out rows as often as the
    job's coordinator would (every tau steps, or ``every``; each stretch draws its
    batches afresh, as a client's task does), up to ``max_steps``.
    ``lr`` and ``batch`` replace the job's: an anchor runs at its own best
    settings, and a batch of players × the job's batch is the ideal synchronous
    crowd. The job's ``strategy.schedule`` multiplies the lr, one step counting as
    one version, set at the start of each stretch: the anchor may warm up too.
    """
    spec = job.spec
    params = spec.init_params(job.model.init_seed)
    s = job.strategy
    opt = Optimizer.from_dict(
        {"kind": s.client_optimizer, "lr": s.lr if lr is None else lr, "momentum": s.momentum}
    )
    state = OptState.init(opt, spec)
    rng = np.random.default_rng(job.data.seed)
    n = job.eval.max_samples or dataset.X_test.shape[0]
    every = max(1, s.nominal_tau if every is None else every)
    schedule = s.schedule.model_dump()
    done = 0
    while done < max_steps:
        size = job.data.batch if batch is None else batch
        if schedule["kind"] != "constant":
            factor = schedule_factor(done, **schedule)
            state.optimizer = dataclasses.replace(opt, lr=opt.lr * factor)
        train_steps(params, state, dataset.X_train, dataset.y_train, every, size, rng)
        done += every
        yield done, evaluate(params, dataset.X_test[:n], dataset.y_test[:n])


def linear_steps_to_target(
    job: Any, dataset: Dataset, target: float, *, max_steps: int = 20_000
) -> int | None:
    """Mini-batch steps one machine needs to reach ``target`` test accuracy, or None."""
    for done, r in linear_evaluations(job, dataset, max_steps=max_steps):
        if r.accuracy >= target:
            return done
    return None
