"""run_task for distill tasks: the distillation maths on the task's shard."""

from __future__ import annotations

import numpy as np
import pytest

from client.compute import SlicedTask, run_task
from compression.distill import distill_steps, teacher_targets
from nn.data import load_dataset
from nn.optim import Optimizer, OptState
from nn.rng import Xoshiro128ss
from nn.spec import ModelSpec
from protocol import messages as m

STUDENT = ModelSpec(widths=(64, 16, 10))
TEACHER = ModelSpec(widths=(64, 32, 10))


def distill_task(data, *, alpha: float, kind: str = "distill") -> m.Task:
    idx = np.arange(0, 300, 2, dtype=np.int32)
    logits = teacher_targets(TEACHER.init_params(5), STUDENT, data.X_train)[idx]
    return m.Task(
        task_id="7",
        kind=kind,
        model_version=0,
        spec=STUDENT,
        dataset="digits#0",
        indices=idx,
        steps=5,
        batch=8,
        optimizer={"kind": "sgd", "lr": 0.1},
        seed=3,
        base_version=0,
        teacher_logits=logits if kind == "distill" else None,
        temperature=2.0,
        distill_alpha=alpha,
    )


def test_distill_task_runs_distill_steps_on_the_shard() -> None:
    data = load_dataset("digits", seed=0)
    task = distill_task(data, alpha=0.6)
    base = STUDENT.init_params(1)
    out = run_task(task, base, data)
    ref = base.copy()
    idx = task.indices.astype(np.int64)
    distill_steps(
        ref, OptState.init(Optimizer(kind="sgd", lr=0.1), STUDENT), data.X_train[idx],
        task.teacher_logits.astype(np.float32), data.y_train[idx], steps=5, batch=8,
        temperature=2.0, alpha=0.6, rng=Xoshiro128ss(3, 0),
    )  # fmt: skip
    np.testing.assert_array_equal(out.update, ref.data - base.data)
    assert out.steps == 5 and out.samples == 40 and np.isfinite(out.loss)
    np.testing.assert_array_equal(base.data, STUDENT.init_params(1).data)  # base untouched


def test_alpha_zero_is_plain_training() -> None:
    """With no weight on the teacher the loss is cross-entropy: the train update."""
    data = load_dataset("digits", seed=0)
    base = STUDENT.init_params(1)
    kd = run_task(distill_task(data, alpha=0.0), base, data)
    plain = run_task(distill_task(data, alpha=0.0, kind="train"), base, data)
    np.testing.assert_allclose(kd.update, plain.update, atol=1e-5)


def test_distill_task_without_logits_is_refused() -> None:
    data = load_dataset("digits", seed=0)
    task = distill_task(data, alpha=0.5)
    with pytest.raises(ValueError, match="teacher_logits"):
        m.Task(**{**{f: getattr(task, f) for f in task.SCHEMA}, "teacher_logits": None})
    with pytest.raises(ValueError, match=r"task.teacher_logits: expected shape \[150, 10\]"):
        m.Task(
            **{
                **{f: getattr(task, f) for f in task.SCHEMA},
                "teacher_logits": task.teacher_logits[:-1],
            }
        )


def test_a_sliced_distill_task_is_run_task_bit_for_bit() -> None:
    data = load_dataset("digits", seed=0)
    task = distill_task(data, alpha=0.6)
    base = STUDENT.init_params(1)
    sliced = SlicedTask(task, base, data)
    while not sliced.finished:
        sliced.run(2)
    np.testing.assert_array_equal(sliced.output().update, run_task(task, base, data).update)
