"""Distillation: the KD gradient against finite differences, and the student's accuracy."""

from __future__ import annotations

import numpy as np
import pytest

from compression.distill import distill, distill_steps, kd_grad_
from nn.optim import Optimizer, OptState
from nn.spec import ModelSpec
from nn.train import evaluate, forward_outputs, train_steps


def kd_loss(z, t, y, T, alpha):
    def log_softmax(v):
        v = v - v.max(axis=1, keepdims=True)
        return v - np.log(np.exp(v).sum(axis=1, keepdims=True))

    ls, lst, ltt = log_softmax(z), log_softmax(z / T), log_softmax(t / T)
    kl = (np.exp(ltt) * (ltt - lst)).sum(axis=1)
    ce = -ls[np.arange(len(y)), y]
    return float((alpha * T * T * kl + (1 - alpha) * ce).mean())


@pytest.mark.parametrize(("T", "alpha"), [(1.0, 0.0), (4.0, 0.7), (2.5, 1.0)])
def test_kd_gradient_matches_finite_differences(T: float, alpha: float) -> None:
    rng = np.random.default_rng(0)
    z = rng.standard_normal((5, 4))
    t = rng.standard_normal((5, 4)) * 3
    y = rng.integers(0, 4, 5)
    D = np.empty_like(z)
    value = kd_grad_(z, t, y, np.arange(5), T, alpha, D)
    assert value == pytest.approx(kd_loss(z, t, y, T, alpha), rel=1e-10)
    num = np.empty_like(z)
    h = 1e-6
    for idx in np.ndindex(*z.shape):
        zp, zm = z.copy(), z.copy()
        zp[idx] += h
        zm[idx] -= h
        num[idx] = (kd_loss(zp, t, y, T, alpha) - kd_loss(zm, t, y, T, alpha)) / (2 * h)
    np.testing.assert_allclose(D, num, atol=1e-7)


def test_alpha_zero_is_plain_training(digits) -> None:
    spec = ModelSpec(widths=(64, 16, 10))
    a, b = spec.init_params(0), spec.init_params(0)
    opt = Optimizer(kind="sgd", lr=0.1)
    X, y = digits.X_train, digits.y_train
    train_steps(a, OptState.init(opt, spec), X, y, 30, 16, np.random.default_rng(2))
    junk = np.zeros((X.shape[0], 10), np.float32)
    distill_steps(
        b, OptState.init(opt, spec), X, junk, y, steps=30, batch=16, alpha=0.0,
        rng=np.random.default_rng(2),
    )  # fmt: skip
    assert b.allclose(a, atol=1e-5)


def test_student_within_one_and_a_half_points_of_teacher(digits, teacher) -> None:
    t_acc = evaluate(teacher, digits.X_test, digits.y_test).accuracy
    student = distill(
        teacher, ModelSpec(widths=(64, 32, 10)), digits.X_train, digits.y_train,
        steps=3000, temperature=4.0, alpha=0.7,
    )  # fmt: skip
    s_acc = evaluate(student, digits.X_test, digits.y_test).accuracy
    assert s_acc >= t_acc - 0.015, (t_acc, s_acc)


def test_distillation_is_deterministic(digits, teacher) -> None:
    runs = [
        distill(teacher, ModelSpec(widths=(64, 8, 10)), digits.X_train, digits.y_train, steps=50)
        for _ in range(2)
    ]
    assert runs[0].array_equal(runs[1])


def test_bad_arguments_name_the_fault(digits) -> None:
    spec = ModelSpec(widths=(64, 8, 10))
    p, st = spec.init_params(0), OptState.init(Optimizer(), spec)
    X, y = digits.X_train[:10], digits.y_train[:10]
    t = forward_outputs(p, X)
    rng = np.random.default_rng(0)
    for kwargs, match in [
        (dict(temperature=0.0), "temperature"),
        (dict(alpha=1.5), "alpha"),
        (dict(steps=-1), "steps"),
        (dict(batch=0), "batch"),
    ]:
        args = dict(steps=1, batch=4, rng=rng) | kwargs
        with pytest.raises(ValueError, match=match):
            distill_steps(p, st, X, t, y, **args)
    with pytest.raises(ValueError, match="teacher_logits"):
        distill_steps(p, st, X, t[:5], y, steps=1, batch=4, rng=rng)
    with pytest.raises(ValueError, match="labels"):
        distill_steps(p, st, X, t, y + 10, steps=1, batch=4, rng=rng)
    with pytest.raises(ValueError, match="input and output"):
        distill(p, ModelSpec(widths=(32, 10)), X, y, steps=1)
