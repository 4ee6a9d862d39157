"""Post-training int8 quantization: per-row scales and a numba inference path.

Each weight row (one neuron) gets its own symmetric scale ``max|W[j,:]| / 127``,
because neuron magnitudes differ by orders of magnitude and one scale per layer
would flatten the small ones to zero. Biases stay float32 (``out`` values per
layer, noise next to ``out × in``). Inference never rebuilds float weights: the
kernel multiplies float32 activations by the int8 row and applies the row scale
once per output, ``y[j] = scale[j] · Σ_k x[k]·q[j,k] + b[j]``.

Storage (``save``/``load``): a ``.npz`` in the spirit of ``nn.modelfile`` but its
own format, ``crowdgrad-qmodel``, so a plain model loader can never mistake int8
codes for float weights. Arrays: ``__header__`` (JSON: format, format_version,
spec, scheme, metadata), ``q{l}`` int8 ``[out, in]``, ``s{l}`` float32 ``[out]``,
``b{l}`` float32 ``[out]``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit

import nn
from compression.uniform import quantize
from nn.jitcache import keep_in_step
from nn.kernels import ACT_CODES, code_of
from nn.modelfile import open_npz, read_header, write_npz
from nn.params import Params
from nn.spec import ModelSpec

# Compiled with nn's kernels in it: its numba cache follows nn's sources too.
keep_in_step(Path(__file__).parent, depends_on=(Path(nn.__file__).parent,))

FORMAT = "crowdgrad-qmodel"
FORMAT_VERSION = 1
SCHEME = "int8-row"


@njit(cache=True, nogil=True, fastmath=True)
def _act(v, act):  # pragma: no cover - compiled
    if act == 1:
        return v if v > 0 else np.float32(0.0)
    if act == 2:
        return np.float32(np.tanh(v))
    if act == 3:
        return np.float32(1.0 / (1.0 + np.exp(-v)))
    return v


@njit(cache=True, nogil=True, fastmath=True)
def _qlayer(q, scales, bias, act, a, z):  # pragma: no cover - compiled
    """``z := act(scale · (q @ a) + b)``; a 2-D view vectorises, flat offsets did not."""
    for j in range(q.shape[0]):
        acc = np.float32(0.0)
        for k in range(q.shape[1]):
            acc += a[k] * q[j, k]
        z[j] = _act(acc * scales[j] + bias[j], act)


@njit(cache=True, nogil=True, fastmath=True)
def qforward(qw, scales, bias, shapes, woffs, soffs, acts, X, out):  # pragma: no cover
    """Run every row of X through the int8 network into ``out`` (one row at a time).

    ``qw`` holds all layers' int8 rows back to back (layer l at ``woffs[l]``);
    ``scales`` and ``bias`` hold all layers' per-row values (layer l at ``soffs[l]``).
    """
    widest = X.shape[1]
    for l in range(shapes.shape[0]):
        widest = max(widest, shapes[l, 0])
    a = np.empty(widest, np.float32)
    z = np.empty(widest, np.float32)
    for r in range(X.shape[0]):
        for k in range(X.shape[1]):
            a[k] = X[r, k]
        for l in range(shapes.shape[0]):
            o, i = shapes[l, 0], shapes[l, 1]
            w0, s0 = woffs[l], soffs[l]
            q = qw[w0 : w0 + o * i].reshape(o, i)
            _qlayer(q, scales[s0 : s0 + o], bias[s0 : s0 + o], acts[l], a[:i], z[:o])
            a[:o] = z[:o]
        last = shapes[shapes.shape[0] - 1, 0]
        for j in range(last):
            out[r, j] = a[j]


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantizedModel:
    """An int8 model: flat int8 weights, per-row float32 scales and biases."""

    spec: ModelSpec
    qw: np.ndarray
    scales: np.ndarray
    bias: np.ndarray

    def __post_init__(self) -> None:
        w = sum(o * i for o, i in self.spec.layer_shapes)
        rows = sum(o for o, _ in self.spec.layer_shapes)
        if self.qw.dtype != np.int8 or self.qw.shape != (w,):
            raise ValueError(
                f"quantized model: qw must be int8 [{w}], got {self.qw.dtype} {self.qw.shape}"
            )
        for name in ("scales", "bias"):
            arr = getattr(self, name)
            if arr.dtype != np.float32 or arr.shape != (rows,):
                raise ValueError(f"quantized model: {name} must be float32 [{rows}]")
            if not np.isfinite(arr).all():
                raise ValueError(f"quantized model: {name} holds non-finite values")

    # -- layout -----------------------------------------------------------------

    def _offsets(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        shapes = np.array(self.spec.layer_shapes, np.int64).reshape(-1, 2)
        woffs = np.concatenate([[0], np.cumsum(shapes[:, 0] * shapes[:, 1])[:-1]]).astype(np.int64)
        soffs = np.concatenate([[0], np.cumsum(shapes[:, 0])[:-1]]).astype(np.int64)
        return shapes, woffs, soffs

    def layer(self, li: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(q [out, in] int8, scales [out], b [out])`` views of layer ``li``."""
        shapes, woffs, soffs = self._offsets()
        o, i = (int(v) for v in shapes[li])
        w0, s0 = int(woffs[li]), int(soffs[li])
        return (
            self.qw[w0 : w0 + o * i].reshape(o, i),
            self.scales[s0 : s0 + o],
            self.bias[s0 : s0 + o],
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays that make the model: int8 weights plus float32 scales and biases."""
        return self.qw.nbytes + self.scales.nbytes + self.bias.nbytes

    # -- inference ----------------------------------------------------------------

    def forward(self, X: np.ndarray) -> np.ndarray:
        """Raw outputs ``[n, out]`` (before softmax), computed on the int8 weights."""
        X = np.ascontiguousarray(X, dtype=np.float32)
        if X.ndim != 2 or X.shape[1] != self.spec.widths[0]:
            raise ValueError(f"X: expected shape [n, {self.spec.widths[0]}], got {X.shape}")
        shapes, woffs, soffs = self._offsets()
        acts = np.array([code_of(a, ACT_CODES, "activation") for a in self.spec.activations])
        out = np.empty((X.shape[0], self.spec.widths[-1]), np.float32)
        qforward(self.qw, self.scales, self.bias, shapes, woffs, soffs, acts, X, out)
        return out

    def accuracy(self, X: np.ndarray, y: np.ndarray) -> float:
        return float((self.forward(X).argmax(axis=1) == np.asarray(y)).mean())

    def dequantize(self) -> Params:
        """Float32 Params with the quantised values (for training or a plain runtime)."""
        layers = []
        for li in range(self.spec.num_layers):
            q, s, b = self.layer(li)
            layers.append((q.astype(np.float32) * s[:, None], b))
        return Params.from_layers(self.spec, layers)

    # -- storage ----------------------------------------------------------------

    def save(self, path: str | os.PathLike[str], *, metadata: dict | None = None) -> Path:
        """Write atomically (temp file, then rename); see the module docstring."""
        header = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "spec": self.spec.to_dict(),
            "scheme": SCHEME,
            "metadata": metadata or {},
        }
        arrays = {}
        for li in range(self.spec.num_layers):
            q, s, b = self.layer(li)
            arrays[f"q{li}"], arrays[f"s{li}"], arrays[f"b{li}"] = q, s, b
        return write_npz(path, header, arrays)


def quantize_model(params: Params) -> QuantizedModel:
    """Per-row symmetric int8 quantization of every layer's weights."""
    qs, ss = [], []
    for W in params.W:
        q, s = quantize(np.ascontiguousarray(W), 127)
        qs.append(q.reshape(-1))
        ss.append(s)
    return QuantizedModel(
        spec=params.spec,
        qw=np.concatenate(qs).astype(np.int8),
        scales=np.concatenate(ss).astype(np.float32),
        bias=np.concatenate([b.astype(np.float32) for b in params.b]),
    )


def is_quantized_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a ``crowdgrad-qmodel`` file (vs. a plain model file)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return read_header(z, Path(path)).get("format") == FORMAT
    except (OSError, ValueError):
        return False


def load_quantized(path: str | os.PathLike[str]) -> tuple[QuantizedModel, dict]:
    """Read a quantized model file: ``(model, metadata)``; a bad file names its fault."""
    path = Path(path)
    with open_npz(path, FORMAT, FORMAT_VERSION) as (z, header):
        if header.get("scheme") != SCHEME:
            raise ValueError(f"{path}: unknown quantization scheme {header.get('scheme')!r}")
        spec = ModelSpec.from_dict(header["spec"])
        qs, ss, bs = [], [], []
        for li, (o, i) in enumerate(spec.layer_shapes):
            try:
                q, s, b = z[f"q{li}"], z[f"s{li}"], z[f"b{li}"]
            except KeyError:
                raise ValueError(f"{path}: missing q{li}, s{li} or b{li}") from None
            if q.shape != (o, i) or s.shape != (o,) or b.shape != (o,):
                raise ValueError(f"{path}: layer {li} arrays do not match the spec {(o, i)}")
            qs.append(q.reshape(-1))
            ss.append(s)
            bs.append(b)
    model = QuantizedModel(
        spec=spec,
        qw=np.concatenate(qs).astype(np.int8),
        scales=np.concatenate(ss).astype(np.float32),
        bias=np.concatenate(bs).astype(np.float32),
    )
    return model, header.get("metadata", {})
