"""Sub-networks by neuron group: the slice a sub-model task trains, and its merge back.

A *subnet* keeps a subset of every hidden layer's neurons: those rows of layer l (W rows and
biases) and the matching columns of layer l+1. The input and output layers keep all their
units, so a subnet is itself an ordinary MLP with narrower hidden widths (``Subnet.sub``): any
client trains it as it trains any model, and only the coordinator needs to know where its
parameters sit in the whole one.

Rescaling is dropout's correction written into the weights: a kept neuron's outgoing weights
are sent multiplied by ``(n/k)^rescale`` (its layer's width over the kept count), and the
update that comes back is divided by the same factor before it lands. ``rescale = 1`` is
inverted dropout (the next layer's inputs keep their mean), ``0.5`` keeps their variance.
Slicing and merging walk the kept block row by row in compiled loops (``_gather_block``,
``_add_block``). Which rescale for which net: docs/coordinator.md ("Sub-model tasks"); the
figures and the loops against ``np.ix_``: docs/performance.md, docs/decisions.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from nn.params import Params
from nn.spec import ModelSpec


def hidden_widths(spec: ModelSpec) -> tuple[int, ...]:
    return spec.widths[1:-1]


def sub_widths(spec: ModelSpec, fraction: float) -> tuple[int, ...]:
    """Every hidden layer's kept count at ``fraction`` (at least one neuron each)."""
    return tuple(max(1, min(n, round(fraction * n))) for n in hidden_widths(spec))


def sub_spec(spec: ModelSpec, kept: Sequence[int]) -> ModelSpec:
    """The spec of a subnet keeping ``kept[l]`` neurons of hidden layer l."""
    return ModelSpec(
        widths=(spec.widths[0], *kept, spec.widths[-1]),
        activations=spec.activations,
        loss=spec.loss,
        init=spec.init,
    )


@dataclass(frozen=True, slots=True)
class Subnet:
    """Which hidden neurons of ``spec`` a task keeps: ``keep[l]`` holds sorted,
    distinct indices into hidden layer l."""

    spec: ModelSpec
    keep: tuple[np.ndarray, ...]
    #: the exponent of ``n/k`` the kept outgoing weights travel at (0: none)
    rescale: float = 1.0
    #: the subnet's own spec (derived)
    sub: ModelSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        hidden = hidden_widths(self.spec)
        if len(self.keep) != len(hidden):
            raise ValueError(
                f"subnet: {len(hidden)} hidden layers, got {len(self.keep)} index sets"
            )
        keep = []
        for li, (idx, n) in enumerate(zip(self.keep, hidden, strict=True)):
            a = np.asarray(idx, dtype=np.int64).reshape(-1)
            if a.size < 1:
                raise ValueError(f"subnet: hidden layer {li} keeps no neuron")
            if a.min() < 0 or a.max() >= n:
                raise ValueError(f"subnet: hidden layer {li} has {n} neurons, index out of range")
            if a.size > 1 and not np.all(np.diff(a) > 0):
                raise ValueError(f"subnet: hidden layer {li}: indices must be sorted and distinct")
            keep.append(a)
        object.__setattr__(self, "keep", tuple(keep))
        object.__setattr__(self, "sub", sub_spec(self.spec, [a.size for a in keep]))

    # -- the wire form: one array of every hidden layer's indices in order ----------

    def to_wire(self) -> np.ndarray:
        return np.concatenate(self.keep).astype(np.uint32)

    @classmethod
    def from_wire(
        cls, spec: ModelSpec, sub: ModelSpec, flat: np.ndarray, *, rescale: float
    ) -> Subnet:
        """Split the flat indices by ``sub``'s hidden widths (the task's spec)."""
        kept = hidden_widths(sub)
        flat = np.asarray(flat).reshape(-1)
        if flat.size != sum(kept):
            raise ValueError(f"subnet: {flat.size} indices for hidden widths {list(kept)}")
        ends = np.cumsum(kept)[:-1]
        return cls(spec, tuple(np.split(flat.astype(np.int64), ends)), rescale)

    def to_state(self) -> dict:
        """For checkpoints (a sync round's results wait for their round's end)."""
        return {"keep": [a.tolist() for a in self.keep], "rescale": float(self.rescale)}

    @classmethod
    def from_state(cls, spec: ModelSpec, state: dict) -> Subnet:
        return cls(
            spec,
            tuple(np.asarray(k, dtype=np.int64) for k in state["keep"]),
            float(state["rescale"]),
        )

    # -- slicing and merging ----------------------------------------------------------

    def rows(self, layer: int) -> np.ndarray | slice:
        """The rows (neurons) of layer ``layer`` whose parameters the subnet holds:
        its kept ones, or every output unit of the last layer."""
        return self.keep[layer] if layer < self.spec.num_layers - 1 else slice(None)

    def _index(self, layer: int) -> tuple[np.ndarray | slice, np.ndarray | slice, float]:
        """Rows and columns of layer ``layer``'s W the subnet keeps, and the scale
        its kept columns travel at ((n/k)^rescale of the layer below)."""
        rows = self.rows(layer)
        cols: np.ndarray | slice = self.keep[layer - 1] if layer > 0 else slice(None)
        scale = 1.0
        if self.rescale and layer > 0:
            scale = (self.spec.widths[layer] / self.keep[layer - 1].size) ** self.rescale
        return rows, cols, scale

    def slice(self, params: Params) -> Params:
        """The subnet's parameters, a new buffer (the whole model is not touched)."""
        if params.spec != self.spec:
            raise ValueError("subnet: params of another spec")
        out = Params(self.sub)
        for li in range(self.spec.num_layers):
            rows, cols, scale = self._index(li)
            # Only the kept block is read: taking the kept rows whole first would
            # read n/k times the slice (84 MB a layer on the extreme preset for 1.6 MB).
            # As a plain array: a memmap's own __getitem__ wraps every result.
            W = np.asarray(params.W[li])
            _gather_block(W, _ids(rows, W.shape[0]), _ids(cols, W.shape[1]),
                          np.float32(scale), out.W[li])  # fmt: skip
            out.b[li][...] = np.asarray(params.b[li])[rows]
        return out

    def expand(self, update: np.ndarray) -> np.ndarray:
        """A subnet update (flat, the subnet's layout) placed in the whole model's
        layout, zero where the subnet has no parameter."""
        sub = Params.from_flat(self.sub, np.ascontiguousarray(update, dtype=np.float32), copy=False)
        out = Params(self.spec)
        for li in range(self.spec.num_layers):
            rows, cols, scale = self._index(li)
            dW = sub.W[li] / np.float32(scale) if scale != 1.0 else sub.W[li]
            out.W[li][_grid(rows, cols)] = dW
            out.b[li][rows] = sub.b[li]
        return out.data

    def add_to(
        self,
        params: Params,
        update: np.ndarray,
        scale: float = 1.0,
        *,
        rows: Sequence[np.ndarray] | None = None,
    ) -> None:
        """``params += scale * expand(update)`` in place, touching only the subnet's
        parameters: no model-sized temporary, so a merge costs the slice, not the
        model (the huge and extreme presets). ``rows``: per layer, a boolean mask
        over the whole layer's rows; only those rows take the update (a replay
        onto a checkpoint whose groups are of different versions)."""
        sub = Params.from_flat(self.sub, np.ascontiguousarray(update, dtype=np.float32), copy=False)
        s = np.float32(scale)
        for li in range(self.spec.num_layers):
            kept, cols, col_scale = self._index(li)
            dW, db = sub.W[li], sub.b[li]
            if rows is not None:
                take = rows[li][kept]
                if not take.any():
                    continue
                if not take.all():
                    kept = np.arange(params.W[li].shape[0])[kept][take]
                    dW, db = dW[take], db[take]
            W = np.asarray(params.W[li])
            f = np.float32(s / np.float32(col_scale))
            _add_block(W, _ids(kept, W.shape[0]), _ids(cols, W.shape[1]), dW, f)
            params.b[li][kept] += db * s

    def cover(self, into: np.ndarray, weight: float = 1.0) -> None:
        """Add ``weight`` to every coordinate of ``into`` (the whole model's layout)
        the subnet holds: the denominators of a per-coordinate mean."""
        acc = Params.from_flat(self.spec, into, copy=False)
        w = np.float32(weight)
        for li in range(self.spec.num_layers):
            rows, cols, _ = self._index(li)
            acc.W[li][_grid(rows, cols)] += w
            acc.b[li][rows] += w


def _ids(index: np.ndarray | slice, n: int) -> np.ndarray:
    """A kept-index array, or ``arange(n)`` for a whole axis (``slice(None)``)."""
    return index if isinstance(index, np.ndarray) else np.arange(n)


@njit(cache=True, nogil=True)
def _gather_block(W, rows, cols, scale, out):  # pragma: no cover - compiled
    """``out = W[rows][:, cols] * scale``, reading only the block."""
    for i in range(rows.size):
        src = W[rows[i]]
        dst = out[i]
        for j in range(cols.size):
            dst[j] = src[cols[j]] * scale


@njit(cache=True, nogil=True)
def _add_block(W, rows, cols, d, f):  # pragma: no cover - compiled
    """``W[rows][:, cols] += d * f`` in place (each product rounded, then the sum:
    what numpy's ``+=`` of the same product computes)."""
    for i in range(rows.size):
        dst = W[rows[i]]
        src = d[i]
        for j in range(cols.size):
            dst[cols[j]] += src[j] * f


def _grid(rows: np.ndarray | slice, cols: np.ndarray | slice) -> tuple:
    """An index selecting the block ``rows x cols`` of a 2-D array (writable)."""
    if isinstance(rows, np.ndarray) and isinstance(cols, np.ndarray):
        return np.ix_(rows, cols)
    return (rows, cols)


def covered_mean(
    updates: Sequence[np.ndarray], weights: Sequence[float], subnets: Sequence[Subnet | None]
) -> np.ndarray:
    """The weighted mean of updates in the whole model's layout, per coordinate over
    the updates whose subnet holds it (0 where none does): a neuron trained by one
    of four clients moves by that client's delta, not a quarter of it."""
    num = np.zeros_like(updates[0], dtype=np.float32)
    den = np.zeros_like(num)
    for u, w, s in zip(updates, weights, subnets, strict=True):
        num += np.float32(w) * u
        if s is None:
            den += np.float32(w)
        else:
            s.cover(den, w)
    np.divide(num, den, out=num, where=den > 0)
    return num
