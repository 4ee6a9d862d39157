"""Size, accuracy and per-sample latency of a model, before and after compression.

The seed's end goal is a model every player runs locally within a frame, so the
latency that matters is one sample at a time (a game asks per frame, not in
batches of 256). It is measured as the median over single-row calls of the
model's own inference path — ``nn.kernels.predict_rows`` for float models, the
int8 kernel for quantised ones — after a warm-up call, so compile time and
Python-level validation are not counted.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

from compression.quantize import QuantizedModel
from nn import kernels
from nn.params import Params
from nn.train import forward_outputs, layout_of


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelStats:
    """``size_bytes``: bytes of the model's arrays as stored (dense; int8 + scales when
    quantised). ``nonzero_weights`` shows what unstructured pruning would save
    with a sparse format."""

    widths: tuple[int, ...]
    num_params: int
    nonzero_weights: int
    size_bytes: int
    accuracy: float
    latency_us: float

    def to_dict(self) -> dict:
        return asdict(self)


def _single_row_runner(model: Params | QuantizedModel):
    if isinstance(model, QuantizedModel):
        shapes, woffs, soffs = model._offsets()
        acts = np.array(
            [kernels.code_of(a, kernels.ACT_CODES, "activation") for a in model.spec.activations]
        )
        from compression.quantize import qforward

        def run(x: np.ndarray, out: np.ndarray) -> None:
            qforward(model.qw, model.scales, model.bias, shapes, woffs, soffs, acts, x, out)

        return run
    lay = layout_of(model.spec)

    def run(x: np.ndarray, out: np.ndarray) -> None:
        kernels.predict_rows(model.data, lay.shapes, lay.offs, lay.acts, x, out)

    return run


def latency_us(model: Params | QuantizedModel, X: np.ndarray, *, samples: int = 200) -> float:
    """Median microseconds to run one sample (row of X) through ``model``."""
    X = np.ascontiguousarray(X, dtype=np.float32)
    run = _single_row_runner(model)
    out = np.empty((1, model.spec.widths[-1]), np.float32)
    run(X[:1], out)  # warm-up: compile or load the cached kernel
    times = np.empty(min(samples, X.shape[0]))
    for r in range(times.size):
        x = X[r : r + 1]
        t0 = time.perf_counter()
        run(x, out)
        times[r] = time.perf_counter() - t0
    return float(np.median(times) * 1e6)


def measure(
    model: Params | QuantizedModel, X: np.ndarray, y: np.ndarray, *, samples: int = 200
) -> ModelStats:
    """Stats of ``model`` on the held-out set (X, y)."""
    if isinstance(model, QuantizedModel):
        logits = model.forward(X)
        nonzero = int(np.count_nonzero(model.qw))
        size = model.nbytes
    else:
        logits = forward_outputs(model, X)
        nonzero = sum(int(np.count_nonzero(W)) for W in model.W)
        size = model.nbytes
    return ModelStats(
        widths=tuple(model.spec.widths),
        num_params=model.spec.num_params,
        nonzero_weights=nonzero,
        size_bytes=size,
        accuracy=float((logits.argmax(axis=1) == np.asarray(y)).mean()),
        latency_us=latency_us(model, X, samples=samples),
    )


def compare(before: ModelStats, after: ModelStats) -> dict:
    """Before, after, and the ratios a reader looks for first."""
    return {
        "before": before.to_dict(),
        "after": after.to_dict(),
        "size_ratio": before.size_bytes / max(1, after.size_bytes),
        "accuracy_delta": after.accuracy - before.accuracy,
        "latency_ratio": before.latency_us / max(1e-9, after.latency_us),
    }
