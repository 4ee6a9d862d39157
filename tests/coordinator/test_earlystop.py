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


def params_of(value: float) -> Params:
    p = Params.zeros(ModelSpec(widths=(4, 3, 2)))
    p.data[:] = value
    return p


def test_patience_evaluations_without_a_new_best_converge_and_keep_the_best() -> None:
    stop = EarlyStop(StopSection(patience=3), model_bytes=1024)
    losses = [1.0, 0.5, 0.7, 0.4, 0.6, math.nan, 0.45]
    converged = [stop.observe(loss, v, params_of(v)) for v, loss in enumerate(losses)]
    assert converged == [False] * 6 + [True]
    assert (stop.best_loss, stop.best_version) == (0.4, 3)
    best = stop.best(version=6)
    assert best is not None and np.all(best == 3.0)  # a copy, not the live model
    assert stop.best(version=3) is None  # the model is the best already


def test_zero_patience_never_converges_and_a_big_model_is_not_kept() -> None:
    never = EarlyStop(StopSection(patience=0), model_bytes=1024)
    assert not any(never.observe(1.0, v, params_of(v)) for v in range(100))
    big = EarlyStop(StopSection(patience=1, keep_best_mib=0.0005), model_bytes=1024)
    big.observe(1.0, 0, params_of(0))
    assert big.observe(2.0, 1, params_of(1))
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
    best = min(evals[:-1], key=lambda e: e.loss)
    assert best.version == fin.best_of
    # the final model is the best one: its evaluation reads the same, bit for bit
    assert evals[-1].version == fin.version and evals[-1].loss == best.loss
    assert fin.accuracy == best.accuracy
    # the last evaluations before the end were all worse than the best
    assert all(e.loss >= best.loss for e in evals[-1 - stop.config.patience : -1])


def test_without_patience_the_same_job_runs_to_its_version_cap() -> None:
    core, _ = run(patience=0)
    assert core.finished is not None and core.finished.reason == "max_versions"
