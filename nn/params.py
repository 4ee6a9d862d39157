"""Params: one contiguous float32 buffer with per-layer ``W`` and ``b`` views.

Theory of operation. Kernels want matrices; codecs, the wire, aggregation and
storage want one flat array. So a Params owns a single 1-D float32 buffer laid out
layer by layer as ``W[0] (out×in, row-major) | b[0] | W[1] | b[1] | ...`` and hands
out views into it. A neuron group ``(layer, row_start, row_end)`` is a set of rows
of one layer: ``W[layer][r0:r1]`` is one contiguous slice of the buffer and
``b[layer][r0:r1]`` another, so chunking never copies to find its data.

Every arithmetic helper works on the flat buffer (one vectorised pass) and checks
that both sides have the same spec; mixing models is a programming error.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from nn.spec import ModelSpec


@dataclass(frozen=True, slots=True, order=True)
class NeuronGroup:
    """Rows ``[row_start, row_end)`` of one layer: its W rows and their biases."""

    layer: int
    row_start: int
    row_end: int

    @property
    def rows(self) -> int:
        return self.row_end - self.row_start


class Params:
    """Weights and biases of an MLP in one buffer; see the module docstring."""

    __slots__ = ("W", "_offsets", "b", "data", "spec")

    def __init__(self, spec: ModelSpec, data: np.ndarray | None = None) -> None:
        n = spec.num_params
        if data is None:
            data = np.zeros(n, dtype=np.float32)
        else:
            if data.dtype != np.float32 or data.ndim != 1 or not data.flags.c_contiguous:
                raise ValueError("params: data must be a 1-D C-contiguous float32 array")
            if data.size != n:
                raise ValueError(f"params: data has {data.size} values, spec needs {n}")
        self.spec = spec
        self.data = data
        self._offsets = spec.layer_offsets()
        W, b = [], []
        for (o, i), (w0, b0, end) in zip(spec.layer_shapes, self._offsets, strict=True):
            W.append(data[w0:b0].reshape(o, i))
            b.append(data[b0:end])
        self.W: tuple[np.ndarray, ...] = tuple(W)
        self.b: tuple[np.ndarray, ...] = tuple(b)

    # -- construction ---------------------------------------------------------------

    @classmethod
    def zeros(cls, spec: ModelSpec) -> Params:
        return cls(spec)

    @classmethod
    def from_flat(cls, spec: ModelSpec, flat: np.ndarray, *, copy: bool = True) -> Params:
        """Wrap (or copy) a flat buffer; ``copy=False`` shares memory with ``flat``."""
        arr = np.asarray(flat)
        if arr.dtype != np.float32:
            raise ValueError(f"params: flat buffer must be float32, got {arr.dtype}")
        arr = arr.reshape(-1)
        return cls(spec, np.array(arr, copy=True) if copy else np.ascontiguousarray(arr))

    @classmethod
    def from_layers(cls, spec: ModelSpec, layers: list[tuple[np.ndarray, np.ndarray]]) -> Params:
        """Build from per-layer ``(W, b)``; shapes must match the spec exactly."""
        p = cls(spec)
        if len(layers) != spec.num_layers:
            raise ValueError(f"params: need {spec.num_layers} layers, got {len(layers)}")
        for li, ((W, b), (o, i)) in enumerate(zip(layers, spec.layer_shapes, strict=True)):
            if np.shape(W) != (o, i) or np.shape(b) != (o,):
                raise ValueError(
                    f"params: layer {li} expects W {(o, i)} and b {(o,)}, "
                    f"got {np.shape(W)} and {np.shape(b)}"
                )
            p.W[li][...] = W
            p.b[li][...] = b
        return p

    def copy(self) -> Params:
        return Params(self.spec, self.data.copy())

    def zeros_like(self) -> Params:
        return Params(self.spec)

    # -- views ----------------------------------------------------------------------

    def flatten(self) -> np.ndarray:
        """The flat buffer itself (no copy); ``.copy()`` it to keep a snapshot."""
        return self.data

    @property
    def layers(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return list(zip(self.W, self.b, strict=True))

    def group(self, layer: int, row_start: int, row_end: int) -> tuple[np.ndarray, np.ndarray]:
        """Views of rows ``[row_start, row_end)`` of layer ``layer``; writes go through."""
        g = self.check_group(NeuronGroup(layer, row_start, row_end))
        return self.W[g.layer][g.row_start : g.row_end], self.b[g.layer][g.row_start : g.row_end]

    def group_slices(self, g: NeuronGroup) -> tuple[slice, slice]:
        """Where a group's W rows and biases lie in the flat buffer."""
        self.check_group(g)
        w0, b0, _ = self._offsets[g.layer]
        n_in = self.spec.layer_shapes[g.layer][1]
        return (
            slice(w0 + g.row_start * n_in, w0 + g.row_end * n_in),
            slice(b0 + g.row_start, b0 + g.row_end),
        )

    def check_group(self, g: NeuronGroup) -> NeuronGroup:
        if not 0 <= g.layer < self.spec.num_layers:
            raise ValueError(
                f"neuron group: layer {g.layer} out of range 0..{self.spec.num_layers - 1}"
            )
        rows = self.spec.layer_shapes[g.layer][0]
        if not 0 <= g.row_start < g.row_end <= rows:
            raise ValueError(
                f"neuron group: rows [{g.row_start}, {g.row_end}) out of range for layer "
                f"{g.layer} with {rows} rows"
            )
        return g

    # -- arithmetic (what deltas need) ------------------------------------------------

    def _same(self, other: Params) -> None:
        if other.spec.widths != self.spec.widths:
            raise ValueError(
                f"params: widths differ ({list(self.spec.widths)} vs {list(other.spec.widths)})"
            )

    def __sub__(self, other: Params) -> Params:
        self._same(other)
        return Params(self.spec, np.subtract(self.data, other.data))

    def __add__(self, other: Params) -> Params:
        self._same(other)
        return Params(self.spec, np.add(self.data, other.data))

    def add_(self, other: Params, scale: float = 1.0) -> Params:
        """``self += scale * other`` in place (axpy); returns self for chaining."""
        self._same(other)
        if scale == 1.0:
            self.data += other.data
        else:
            self.data += np.float32(scale) * other.data
        return self

    def scale_(self, s: float) -> Params:
        self.data *= np.float32(s)
        return self

    def assign_(self, other: Params) -> Params:
        self._same(other)
        self.data[...] = other.data
        return self

    def allclose(self, other: Params, *, rtol: float = 1e-5, atol: float = 1e-7) -> bool:
        self._same(other)
        return bool(np.allclose(self.data, other.data, rtol=rtol, atol=atol))

    def array_equal(self, other: Params) -> bool:
        """Bitwise equality, for determinism tests."""
        self._same(other)
        return self.data.tobytes() == other.data.tobytes()

    def norm(self) -> float:
        return float(np.sqrt(np.dot(self.data.astype(np.float64), self.data.astype(np.float64))))

    def is_finite(self) -> bool:
        """Blockwise: a mask of a mapped 8.6 GB model would be a 2 GB temporary."""
        step = 1 << 22
        return all(
            bool(np.isfinite(self.data[i : i + step]).all()) for i in range(0, self.data.size, step)
        )

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    @property
    def num_params(self) -> int:
        return self.data.size

    def __repr__(self) -> str:
        return f"Params(widths={list(self.spec.widths)}, nbytes={self.nbytes})"


def plan_groups(
    spec: ModelSpec, max_values: int, *, layers: list[int] | None = None
) -> list[NeuronGroup]:
    """Split a model into neuron groups of at most ``max_values`` values each.

    A group holds whole rows (``in`` weights plus one bias each), so a row that alone
    exceeds the budget is a configuration error raised here, before anything is sent
    or stored. Groups come in layer order so a receiver can start on layer 0 early.
    """
    if max_values < 1:
        raise ValueError(f"max_values must be >= 1, got {max_values}")
    groups: list[NeuronGroup] = []
    for li in layers if layers is not None else range(spec.num_layers):
        out, n_in = spec.layer_shapes[li]
        row = n_in + 1
        if row > max_values:
            raise ValueError(
                f"layer {li}: one neuron row holds {row} values, more than the limit of "
                f"{max_values}; raise the message or chunk size limit"
            )
        per = max(1, max_values // row)
        for r0 in range(0, out, per):
            groups.append(NeuronGroup(li, r0, min(out, r0 + per)))
    return groups


def iter_group_views(
    params: Params, groups: list[NeuronGroup]
) -> Iterator[tuple[NeuronGroup, np.ndarray, np.ndarray]]:
    for g in groups:
        W, b = params.group(g.layer, g.row_start, g.row_end)
        yield g, W, b
