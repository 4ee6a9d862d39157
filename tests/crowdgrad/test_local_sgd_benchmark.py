"""benchmarks/local_sgd.py: its shortcut for H = 1 (one step on K batches' rows
instead of K replicas' one-step deltas averaged) is the same step for SGD, and a
run reports the steps to each threshold in order."""

from __future__ import annotations

import numpy as np

from nn.data import classification_task
from nn.optim import Optimizer, OptState
from nn.spec import ModelSpec
from nn.train import train_steps
from tests.bench_module import load_benchmark

local_sgd = load_benchmark("local_sgd")


def test_the_mean_of_one_step_replicas_is_one_step_on_their_rows() -> None:
    spec = ModelSpec(widths=(6, 5, 3))
    rng = np.random.default_rng(0)
    X = rng.standard_normal((16, 6)).astype(np.float32)
    y = rng.integers(0, 3, 16).astype(np.int32)
    opt = Optimizer.from_dict({"kind": "sgd", "lr": 0.3})
    start = spec.init_params(1)
    total = np.zeros_like(start.data)
    for part in (slice(0, 8), slice(8, 16)):  # each replica: one step on its whole shard
        replica = start.copy()
        train_steps(
            replica, OptState.init(opt, spec), X[part], y[part], 1, 8, np.random.default_rng(2)
        )
        total += replica.data
    joint = start.copy()
    train_steps(joint, OptState.init(opt, spec), X, y, 1, 16, np.random.default_rng(3))
    assert not np.allclose(joint.data, start.data)
    np.testing.assert_allclose(total / 2, joint.data, rtol=1e-5, atol=1e-6)


def test_a_run_reports_the_steps_to_each_threshold_in_order() -> None:
    ds = classification_task(2_000, seed=0, test_rows=500)
    for k, h in ((1, 50), (2, 1), (2, 5)):
        r = local_sgd.run(ds, k, h, 0.1, 3_000, 50, (0.2, 0.3))
        assert (r["k"], r["h"]) == (k, h) and r["steps_run"] <= 3_000 + 50
        hits = [r["steps_to"][t] for t in ("0.2", "0.3")]
        assert hits[0] is not None, r  # a tenth better than chance is a few hundred steps
        assert hits[1] is None or hits[1] >= hits[0]
