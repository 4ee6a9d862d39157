"""Knowledge distillation: train a small student on a teacher's softened outputs.

Hinton et al.'s loss, per sample, with temperature ``T`` and mix ``alpha``::

    L = alpha · T² · KL(softmax(t/T) ‖ softmax(z/T)) + (1 − alpha) · CE(y, softmax(z))
    dL/dz = alpha · T · (softmax(z/T) − softmax(t/T)) + (1 − alpha) · (softmax(z) − onehot(y))

(``t`` teacher logits, ``z`` student logits; the ``T²`` keeps the soft term's
gradient scale independent of T.) The teacher's logits are computed once, so a
step costs only the student's forward and backward: it reuses ``nn.kernels``'
forward, backward and optimizer update with this loss gradient in place of the
built-in one. :func:`distill_steps` is a pure function of its arrays — exactly
what a volunteer needs to run a distillation task: student params, the batch's
teacher logits and labels, ``T`` and ``alpha``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numba import njit

import nn
from nn import kernels
from nn.jitcache import keep_in_step
from nn.kernels import MODE_GRAD, MODE_SGD, OPT_CODES, backward, code_of, forward
from nn.optim import Optimizer, OptState
from nn.params import Params
from nn.spec import ModelSpec
from nn.train import (
    Permuter,
    TrainMetrics,
    batch_indices,
    check_inputs,
    forward_outputs,
    layout_of,
)

# Compiled with nn's kernels in it: its numba cache follows nn's sources too.
keep_in_step(Path(__file__).parent, depends_on=(Path(nn.__file__).parent,))

_SGD = OPT_CODES.index("sgd")


@njit(cache=True, nogil=True)
def kd_grad_(out, teacher, labels, idx, temperature, alpha, D):  # pragma: no cover
    """Mean distillation loss over the batch and ``D := dL/dz`` (module docstring)."""
    B, K = out.shape
    total = 0.0
    inv_t = 1.0 / temperature
    ps = np.empty(K)
    pst = np.empty(K)
    ptt = np.empty(K)
    for r in range(B):
        t = idx[r]
        ms = out[r, 0]
        mt = teacher[t, 0]
        for j in range(1, K):
            ms = max(ms, out[r, j])
            mt = max(mt, teacher[t, j])
        s1 = 0.0
        s2 = 0.0
        s3 = 0.0
        for j in range(K):
            ps[j] = np.exp(out[r, j] - ms)
            pst[j] = np.exp((out[r, j] - ms) * inv_t)
            ptt[j] = np.exp((teacher[t, j] - mt) * inv_t)
            s1 += ps[j]
            s2 += pst[j]
            s3 += ptt[j]
        lab = labels[t]
        total += (1.0 - alpha) * (np.log(s1) - (out[r, lab] - ms))
        kl = 0.0
        for j in range(K):
            p = ptt[j] / s3
            q = pst[j] / s2
            if p > 0:
                kl += p * (np.log(p) - np.log(q))
            g = alpha * temperature * (q - p) + (1.0 - alpha) * ps[j] / s1
            if j == lab:
                g -= 1.0 - alpha
            D[r, j] = g / B
        total += alpha * temperature * temperature * kl
    return total / B


@njit(cache=True, nogil=True)
def kd_loop(  # pragma: no cover - compiled
    data, shapes, offs, acts, X, teacher, labels, idx, batch, temperature, alpha,
    opt, lr, mu, nesterov, b1, b2, eps, t0, buf1, buf2, G, losses,
):  # fmt: skip
    """``len(losses)`` distillation steps; mirrors ``nn.kernels.train_loop``."""
    aoff, abuf, D1, D2, Xb = kernels._workspace(shapes, batch, data)
    part = np.empty(0, data.dtype)  # one thread: no neuron-group scratch (nn.kernels.backward)
    scratch = np.empty(D1.shape[0], data.dtype)  # the small updates' copy (weight_product_)
    K = shapes[shapes.shape[0] - 1, 0]
    mode = MODE_SGD if opt == _SGD else MODE_GRAD  # one backward to compile (train_loop)
    step_lr = lr if opt == _SGD else 0.0
    for s in range(losses.shape[0]):
        bidx = idx[s * batch : (s + 1) * batch]
        kernels._gather(X, bidx, Xb)
        out = forward(data, shapes, offs, acts, Xb, abuf, aoff)
        D = D1[: batch * K].reshape(batch, K)
        losses[s] = kd_grad_(out, teacher, labels, bidx, temperature, alpha, D)
        backward(
            data, shapes, offs, acts, Xb, abuf, aoff, D1, D2, G, mode, step_lr, None, part, scratch
        )
        if opt != _SGD:
            kernels.optimizer_update_(
                data, G, opt, lr, mu, nesterov, b1, b2, eps, t0 + s + 1, buf1, buf2
            )


def distill_steps(
    student: Params,
    opt_state: OptState,
    X: np.ndarray,
    teacher_logits: np.ndarray,
    labels: np.ndarray,
    *,
    steps: int,
    batch: int,
    temperature: float = 4.0,
    alpha: float = 0.7,
    rng: Permuter,
) -> TrainMetrics:
    """Run ``steps`` distillation steps on mini-batches of X; updates ``student`` in place.

    ``teacher_logits[n, out]`` are the teacher's raw outputs for the rows of X.
    Deterministic given the rng state, like ``nn.train.train_steps``.
    """
    spec = student.spec
    if spec.loss != "softmax_ce":
        raise ValueError(f"student: distillation needs a softmax_ce model, got {spec.loss!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps: must be an integer >= 0, got {steps!r}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch: must be an integer >= 1, got {batch!r}")
    if not temperature > 0:
        raise ValueError(f"temperature: must be > 0, got {temperature!r}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha: must be in [0, 1], got {alpha!r}")
    X = check_inputs(X, spec)
    n, k = X.shape[0], spec.widths[-1]
    teacher = np.ascontiguousarray(teacher_logits, dtype=np.float32)
    if teacher.shape != (n, k) or not np.isfinite(teacher).all():
        raise ValueError(f"teacher_logits: need finite [{n}, {k}], got {teacher.shape}")
    labels = np.asarray(labels)
    if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels: need integer [{n}], got {labels.dtype} {labels.shape}")
    if n and (labels.min() < 0 or labels.max() >= k):
        raise ValueError(f"labels: must be in [0, {k})")
    if steps == 0:
        return TrainMetrics(steps=0, samples=0, loss=float("nan"), last_loss=float("nan"))
    opt = opt_state.optimizer
    bufs = opt_state.buffers
    empty = np.zeros(0, np.float32)
    buf1 = bufs.get("velocity", bufs.get("m", empty))
    buf2 = bufs.get("v", empty)
    G = empty if opt.kind == "sgd" else np.empty(spec.num_params, np.float32)
    lay = layout_of(spec)
    idx = batch_indices(n, steps, batch, rng)
    losses = np.empty(steps, np.float64)
    kd_loop(
        student.data, lay.shapes, lay.offs, lay.acts, X, teacher, labels.astype(np.int64),
        idx, batch, float(temperature), float(alpha),
        code_of(opt.kind, OPT_CODES, "optimizer"), float(opt.lr), float(opt.momentum),
        bool(opt.nesterov), float(opt.beta1), float(opt.beta2), float(opt.eps),
        opt_state.step, buf1, buf2, G, losses,
    )  # fmt: skip
    opt_state.step += steps
    return TrainMetrics(
        steps=steps, samples=steps * batch, loss=float(losses.mean()), last_loss=float(losses[-1])
    )


def distill(
    teacher: Params,
    student_spec: ModelSpec,
    X: np.ndarray,
    y: np.ndarray,
    *,
    steps: int,
    batch: int = 32,
    temperature: float = 4.0,
    alpha: float = 0.7,
    optimizer: Optimizer | None = None,
    seed: int = 0,
) -> Params:
    """A fresh student of ``student_spec`` distilled from ``teacher`` on (X, y), locally."""
    if student_spec.widths[0] != teacher.spec.widths[0] or (
        student_spec.widths[-1] != teacher.spec.widths[-1]
    ):
        raise ValueError(
            f"student widths {list(student_spec.widths)} must keep the teacher's input and "
            f"output widths ({teacher.spec.widths[0]}, {teacher.spec.widths[-1]})"
        )
    student = student_spec.init_params(seed)
    opt = optimizer or Optimizer(kind="momentum", lr=0.05, momentum=0.9)
    distill_steps(
        student, OptState.init(opt, student_spec), X, forward_outputs(teacher, X), y,
        steps=steps, batch=batch, temperature=temperature, alpha=alpha,
        rng=np.random.default_rng(seed),
    )  # fmt: skip
    return student


def teacher_targets(teacher: Params, student_spec: ModelSpec, X: np.ndarray) -> np.ndarray:
    """The teacher's logits for every row of X, as float16 for the wire.

    A distillation job computes these once on the server and ships each task the
    rows of its shard, so volunteers never receive the teacher itself; float16
    halves those bytes at a relative error (2⁻¹¹) far below what softening by a
    temperature blurs anyway.
    """
    if teacher.spec.loss != "softmax_ce" or student_spec.loss != "softmax_ce":
        raise ValueError("distillation: teacher and student need loss = 'softmax_ce'")
    if student_spec.widths[0] != teacher.spec.widths[0] or (
        student_spec.widths[-1] != teacher.spec.widths[-1]
    ):
        raise ValueError(
            f"student widths {list(student_spec.widths)} must keep the teacher's input and "
            f"output widths ({teacher.spec.widths[0]}, {teacher.spec.widths[-1]})"
        )
    logits = forward_outputs(teacher, X)
    return np.clip(logits, -65504.0, 65504.0).astype(np.float16)
