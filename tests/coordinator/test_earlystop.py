"""Early stopping: the job ends when its held-out loss stops improving, with the
best evaluation's model (coordinator/core/earlystop.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coordinator.core import events as ev
from coordinator.core.assembly import build_core
from coordinator.core.config import JobConfigError, StopSection, parse_job
from coordinator.core.earlystop import EarlyStop
from nn.params import Params
from nn.spec import ModelSpec
from testkit.loopback import Loopback
from tests.coordinator.coord_helpers import digits

SPEC = ModelSpec(widths=(4, 3, 2))  # 23 parameters, 92 bytes
MSE = ModelSpec(widths=(4, 3, 2), loss="mse")


def params_of(value: float) -> Params:
    p = Params.zeros(SPEC)
    p.data[:] = value
    return p


def evaluated(version: int, loss: float, accuracy: float = 0.5) -> ev.Evaluated:
    return ev.Evaluated(version=version, loss=loss, accuracy=accuracy, n=100, now=float(version))


def test_patience_evaluations_without_a_new_best_converge_and_keep_the_best() -> None:
    stop = EarlyStop(StopSection(patience=3, monitor="loss"), SPEC)
    losses = [1.0, 0.5, 0.7, 0.4, 0.6, math.nan, 0.45]
    converged = [stop.observe(evaluated(v, x), params_of(v)) for v, x in enumerate(losses)]
    assert converged == [False] * 6 + [True]
    assert (stop.best_score, stop.best_version) == (0.4, 3)
    best = stop.best(version=6)
    assert best is not None and np.all(best == 3.0)  # a copy, not the live model
    assert stop.best(version=3) is None  # the model is the best already


def test_a_classifier_is_judged_by_accuracy_a_regression_by_loss() -> None:
    evals = [evaluated(0, 1.0, 0.80), evaluated(1, 0.9, 0.78), evaluated(2, 1.2, 0.83)]
    auto = EarlyStop(StopSection(patience=5), SPEC)
    for e in evals:
        auto.observe(e, params_of(e.version))
    assert auto.by_accuracy and auto.best_version == 2  # loss rose, accuracy rose
    mse = EarlyStop(StopSection(patience=5), MSE)
    for e in evals:
        mse.observe(e, params_of(e.version))
    assert not mse.by_accuracy and mse.best_version == 1


def test_the_rounds_of_a_big_crowd_hold_the_end_back() -> None:
    stop = EarlyStop(StopSection(patience=2, monitor="loss"), SPEC)
    stop.observe(evaluated(0, 0.5), params_of(0))
    # two evaluations without a new best, but 20 versions are 0.2 rounds of 100
    assert not stop.observe(evaluated(10, 0.6), params_of(1), concurrency=100.0)
    assert not stop.observe(evaluated(20, 0.6), params_of(2), concurrency=100.0)
    assert stop.observe(evaluated(200, 0.6), params_of(3), concurrency=100.0)


def test_short_tasks_hold_the_end_back_on_the_progress_clock() -> None:
    """Counted on the model's progress clock (tasks a tenth of a round long move
    it by a tenth each), 200 versions of 2 clients are 10 rounds, not 100."""
    stop = EarlyStop(StopSection(patience=20, monitor="loss"), SPEC)
    stop.observe(evaluated(0, 0.5), params_of(0), concurrency=2.0, progress=0.0)
    late = [
        stop.observe(evaluated(v, 0.6), params_of(v), concurrency=2.0, progress=v / 10)
        for v in range(10, 410, 10)
    ]
    assert late.index(True) == 39  # at version 400: 40 progress, 20 rounds of 2


def test_zero_patience_never_converges_and_a_big_model_is_not_kept() -> None:
    never = EarlyStop(StopSection(patience=0), SPEC)
    assert not any(never.observe(evaluated(v, 1.0), params_of(v)) for v in range(100))
    big = EarlyStop(StopSection(patience=1, keep_best_mib=0.00005, monitor="loss"), SPEC)
    big.observe(evaluated(0, 1.0), params_of(0))
    assert big.observe(evaluated(1, 2.0), params_of(1))
    assert big.best(version=1) is None  # converged, but ends with the model it has


def test_negative_patience_is_a_config_error_naming_it() -> None:
    with pytest.raises(JobConfigError, match="patience"):
        parse_job({"stop": {"patience": -1}})


def run(patience: int):
    job = parse_job(
        {
            "model": {"widths": [64, 32, 10]},
            "data": {"shards": 8, "batch": 16},
            "strategy": {"name": "decentral-async", "tau": 10, "lr": 0.2},
            "eval": {"every_versions": 5},
            "stop": {"patience": patience, "max_versions": 3000},
        }
    )
    core = build_core(job, seed=3, dataset=digits())
    lb = Loopback(core)
    for i in range(4):
        lb.add_client(f"c{i}", flops=1e8 * (1 + i % 2))
    lb.run(until=1e6)
    return core, lb


def test_a_crowd_job_ends_converged_with_its_best_model() -> None:
    core, lb = run(patience=8)
    fin = core.finished
    assert fin is not None and fin.reason == "converged"
    assert fin.version < 3000
    stop = core.early_stop
    assert fin.best_of == stop.best_version and fin.best_of is not None
    evals = [o for o in lb.outputs if isinstance(o, ev.Evaluated)]
    best = max(evals[:-1], key=lambda e: (e.accuracy, -e.version))  # the first best
    assert best.version == fin.best_of
    # the final model is the best one: its evaluation reads the same, bit for bit
    assert evals[-1].version == fin.version and evals[-1].loss == best.loss
    assert fin.accuracy == best.accuracy
    # the last evaluations before the end were no better than the best
    assert all(e.accuracy <= best.accuracy for e in evals[-1 - stop.config.patience : -1])


def test_without_patience_the_same_job_runs_to_its_version_cap() -> None:
    core, _ = run(patience=0)
    assert core.finished is not None and core.finished.reason == "max_versions"
