"""Training, gradients, evaluation and prediction on ``Params`` (the public nn API).

This module validates inputs and turns a spec into the layout arrays the kernels
take; the arithmetic is in ``nn.kernels``. Bad input (shapes, non-finite values,
labels out of range, empty batches) is a ValueError naming what was wrong,
because training data and hyperparameters arrive from job files and clients.

Targets: ``softmax_ce`` takes int labels ``[n]``; ``mse`` takes float targets
``[n, out]`` or int labels, which are one-hot encoded. Accuracy compares the
argmax of the prediction with the label (or with the argmax of a float target).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Protocol

import numba
import numpy as np

from nn import kernels
from nn.blas import sgemm_threads
from nn.optim import OptState
from nn.params import Params
from nn.spec import ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainMetrics:
    """``loss`` is the mean of the per-step batch losses, each measured before its step."""

    steps: int
    samples: int
    loss: float
    last_loss: float


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalResult:
    loss: float
    accuracy: float
    n: int


@dataclass(frozen=True, slots=True)
class Layout:
    """What kernels need to know about a spec, as int64 arrays."""

    shapes: np.ndarray
    offs: np.ndarray
    acts: np.ndarray
    loss: int


def layout_of(spec: ModelSpec) -> Layout:
    offsets = spec.layer_offsets()
    return Layout(
        shapes=np.array(spec.layer_shapes, dtype=np.int64).reshape(-1, 2),
        offs=np.array([(w0, b0) for w0, b0, _ in offsets], dtype=np.int64).reshape(-1, 2),
        acts=np.array(
            [kernels.code_of(a, kernels.ACT_CODES, "activation") for a in spec.activations],
            dtype=np.int64,
        ),
        loss=kernels.code_of(spec.loss, kernels.LOSS_CODES, "loss"),
    )


def check_inputs(X: np.ndarray, spec: ModelSpec, *, what: str = "X") -> np.ndarray:
    """X as a C-contiguous float32 ``[n, in]`` with finite values, n >= 1."""
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"{what}: expected a 2-D array [n, {spec.widths[0]}], got shape {X.shape}")
    if X.shape[1] != spec.widths[0]:
        raise ValueError(
            f"{what}: has {X.shape[1]} features per row, the model's input width is "
            f"{spec.widths[0]}"
        )
    if X.shape[0] == 0:
        raise ValueError(f"{what}: empty (0 rows)")
    if not np.issubdtype(X.dtype, np.number) or np.iscomplexobj(X):
        raise ValueError(f"{what}: expected real numbers, got dtype {X.dtype}")
    X = np.ascontiguousarray(X, dtype=np.float32)
    if not np.isfinite(X).all():
        raise ValueError(f"{what}: contains NaN or inf")
    return X


def check_targets(y: np.ndarray, n: int, spec: ModelSpec) -> tuple[np.ndarray, np.ndarray]:
    """``(T, labels)`` for the kernels: float targets for mse, int labels for CE."""
    y = np.asarray(y)
    k = spec.widths[-1]
    if y.shape[:1] != (n,):
        raise ValueError(f"y: has {y.shape[0] if y.ndim else 0} rows, X has {n}")
    labels = np.zeros(0, np.int64)
    T = np.zeros((0, k), np.float32)
    if np.issubdtype(y.dtype, np.integer):
        if y.ndim != 1:
            raise ValueError(f"y: integer labels must be 1-D, got shape {y.shape}")
        if y.size and (y.min() < 0 or y.max() >= k):
            raise ValueError(f"y: labels must be in [0, {k}), got range [{y.min()}, {y.max()}]")
        if spec.loss == "softmax_ce":
            return T, y.astype(np.int64)
        T = np.zeros((n, k), np.float32)
        T[np.arange(n), y] = 1.0
        return T, labels
    if spec.loss == "softmax_ce":
        raise ValueError(f"y: softmax_ce needs integer class labels, got dtype {y.dtype}")
    if y.ndim != 2 or y.shape[1] != k:
        raise ValueError(f"y: mse targets must have shape [{n}, {k}], got {y.shape}")
    if not np.issubdtype(y.dtype, np.floating):
        raise ValueError(f"y: expected float targets or int labels, got dtype {y.dtype}")
    T = np.ascontiguousarray(y, dtype=np.float32)
    if not np.isfinite(T).all():
        raise ValueError("y: contains NaN or inf")
    return T, labels


def group_threads(lay: Layout, batch: int) -> int:
    """Threads that share a big layer's rows (neuron groups) in ``train_steps``.

    numba's thread count in the calling thread (``nn.threads.set_threads``), or 1
    when no layer is big enough to split: then BLAS keeps its own thread count.
    """
    n = numba.get_num_threads()
    if n < 2:
        return 1
    o, i = lay.shapes[:, 0], lay.shapes[:, 1]
    big = (batch * o * i >= kernels.PAR_MIN_MACS) & (o >= 2 * kernels.PAR_MIN_ROWS)
    return n if big.any() else 1


class Permuter(Protocol):
    """What batch sampling needs of a generator: NumPy's ``Generator`` or the
    portable ``nn.rng.Xoshiro128ss`` that clients use (docs/protocol.md §12.2)."""

    def permutation(self, n: int, /) -> np.ndarray: ...


def batch_indices(n: int, steps: int, batch: int, rng: Permuter) -> np.ndarray:
    """``steps·batch`` row indices: consecutive permutations of ``range(n)``, so
    sampling is without replacement within each epoch of the call."""
    need = steps * batch
    reps = -(-need // n)
    return np.concatenate([rng.permutation(n) for _ in range(reps)])[:need].astype(np.int64)


def train_steps(
    params: Params,
    opt_state: OptState,
    X: np.ndarray,
    y: np.ndarray,
    steps: int,
    batch: int,
    rng: Permuter,
) -> TrainMetrics:
    """Run ``steps`` optimizer steps on mini-batches of X; updates params in place.

    Deterministic given the rng state (and a fixed BLAS thread count). The whole
    loop runs in one compiled call that releases the GIL.
    """
    spec = params.spec
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 0:
        raise ValueError(f"steps: must be an integer >= 0, got {steps!r}")
    if isinstance(batch, bool) or not isinstance(batch, int | np.integer) or batch < 1:
        raise ValueError(f"batch: must be an integer >= 1 (empty batch), got {batch!r}")
    X = check_inputs(X, spec)
    T, labels = check_targets(y, X.shape[0], spec)
    if steps == 0:
        return TrainMetrics(steps=0, samples=0, loss=float("nan"), last_loss=float("nan"))
    opt = opt_state.optimizer
    bufs = opt_state.buffers
    n = spec.num_params
    for name, buf in bufs.items():
        if buf.dtype != np.float32 or buf.shape != (n,) or not buf.flags.c_contiguous:
            raise ValueError(f"opt_state: buffer {name!r} does not match the model ({n} values)")
    empty = np.zeros(0, np.float32)
    if opt.kind == "momentum":
        buf1, buf2 = bufs["velocity"], empty
    elif opt.kind == "adam":
        buf1, buf2 = bufs["m"], bufs["v"]
    else:
        buf1, buf2 = empty, empty
    G = empty if opt.kind == "sgd" else np.empty(n, np.float32)
    lay = layout_of(spec)
    idx = batch_indices(X.shape[0], int(steps), int(batch), rng)
    losses = np.empty(int(steps), np.float64)
    parts = group_threads(lay, int(batch))
    with sgemm_threads(1) if parts > 1 else nullcontext():
        kernels.train_loop(
            params.data, lay.shapes, lay.offs, lay.acts, lay.loss, X, T, labels, idx, int(batch),
            kernels.code_of(opt.kind, kernels.OPT_CODES, "optimizer"), float(opt.lr),
            float(opt.momentum), bool(opt.nesterov), float(opt.beta1), float(opt.beta2),
            float(opt.eps), opt_state.step, buf1, buf2, G, losses, parts if parts > 1 else None,
        )  # fmt: skip
    opt_state.step += int(steps)
    return TrainMetrics(
        steps=int(steps),
        samples=int(steps) * int(batch),
        loss=float(losses.mean()),
        last_loss=float(losses[-1]),
    )


def compute_gradient(params: Params, X: np.ndarray, y: np.ndarray) -> tuple[float, Params]:
    """Mean loss and its gradient over all rows of X (what central strategies ship)."""
    spec = params.spec
    X = check_inputs(X, spec)
    T, labels = check_targets(y, X.shape[0], spec)
    lay = layout_of(spec)
    grad = Params.zeros(spec)
    value = kernels.loss_and_grad(
        params.data, lay.shapes, lay.offs, lay.acts, lay.loss, X, T, labels, grad.data
    )
    return float(value), grad


def forward_outputs(params: Params, X: np.ndarray) -> np.ndarray:
    """Raw outputs of the last layer (before softmax), ``[n, out]`` float32."""
    spec = params.spec
    X = check_inputs(X, spec)
    lay = layout_of(spec)
    out = np.empty((X.shape[0], spec.widths[-1]), np.float32)
    kernels.predict_rows(params.data, lay.shapes, lay.offs, lay.acts, X, out)
    return out


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def predict(params: Params, X: np.ndarray) -> np.ndarray:
    """Output activations; softmax probabilities when the loss is softmax_ce."""
    out = forward_outputs(params, X)
    return softmax(out) if params.spec.loss == "softmax_ce" else out


def evaluate(params: Params, X: np.ndarray, y: np.ndarray) -> EvalResult:
    """Mean loss (same definition as training) and argmax accuracy over all rows."""
    spec = params.spec
    X = check_inputs(X, spec)
    T, labels = check_targets(y, X.shape[0], spec)
    out = forward_outputs(params, X).astype(np.float64)
    n = X.shape[0]
    if spec.loss == "softmax_ce":
        z = out - out.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        loss = float(-logp[np.arange(n), labels].mean())
        truth = labels
    else:
        loss = float(((out - T) ** 2).mean())
        truth = T.argmax(axis=1)
    accuracy = float((out.argmax(axis=1) == truth).mean())
    return EvalResult(loss=loss, accuracy=accuracy, n=n)


def fit(
    params: Params,
    opt_state: OptState,
    X: np.ndarray,
    y: np.ndarray,
    steps: int,
    batch: int,
    rng: np.random.Generator,
    *,
    chunk: int = 100,
    on_chunk: Callable[[int, TrainMetrics], None] | None = None,
) -> list[TrainMetrics]:
    """``train_steps`` in chunks of ``chunk`` steps, reporting after each chunk.

    For front ends (progress bars, clients that must yield between slices): the
    result equals one ``train_steps`` call with the same rng only when ``chunk``
    divides into whole epochs, because each call restarts its permutation.
    """
    if chunk < 1:
        raise ValueError(f"chunk: must be >= 1, got {chunk}")
    history = []
    done = 0
    while done < steps:
        n = min(chunk, steps - done)
        m = train_steps(params, opt_state, X, y, n, batch, rng)
        done += n
        history.append(m)
        if on_chunk is not None:
            on_chunk(done, m)
    return history
