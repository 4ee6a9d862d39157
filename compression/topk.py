"""Top-k sparsification: send only the largest-magnitude fraction of a block.

``k = ceil(fraction · n)`` (at least 1 for a non-empty block; see :func:`kept`)
values survive, the largest magnitudes with ties going to the lower index (see
:func:`top_indices`), at their flat row-major indices; the rest decode as zero.
Both rules are exact so that every client's encoding of a block is the same bytes
(docs/protocol.md §11). Alone it is biased (it
drops the small values every time), which is why it is meant to run under
:class:`compression.feedback.ErrorFeedback`. ``+int8`` quantises the surviving
values with one symmetric scale.

Byte layouts (little-endian; ``k`` = kept values):

* ``topk``:       ``<I`` k, ``<{k}I`` indices, ``<{k}f`` values        (4 + 8k bytes)
* ``topk+int8``:  ``<I`` k, ``<{k}I`` indices, ``<f`` scale, ``<{k}b`` values
  in [-127, 127]                                                        (8 + 5k bytes)

Indices must be strictly increasing and below ``n``; ``k`` must not exceed ``n``.
The fraction only steers the encoder, so the registered ``topk:0.01`` instance
decodes a payload made with any fraction.
"""

from __future__ import annotations

import math
import re
import struct

import numpy as np

from compression.codecs import (
    Codec,
    CodecError,
    CodecId,
    _as_block,
    block_size,
    check_finite,
    register,
    register_parser,
)
from compression.uniform import check_scales, quantize

_COUNT = struct.Struct("<I")
_SCALE = struct.Struct("<f")


#: ``kept`` forgives a float64 product this far above an integer (2⁻²⁰): the
#: representation error of a decimal fraction (0.07·100 = 7.000000000000001).
_SLACK = 2.0**-20


def kept(n: int, fraction: float) -> int:
    """How many values top-k keeps of ``n``: ``ceil(fraction·n − 2⁻²⁰)`` in float64,
    clamped to ``[1, n]``, so that 7 % of 100 is 7, not 8. For ``n <= 2**32`` the
    subtraction is exact, so any language gets the same count."""
    if n == 0:
        return 0
    return min(n, max(1, math.ceil(float(fraction) * n - _SLACK)))


def top_indices(flat: np.ndarray, k: int) -> np.ndarray:
    """Increasing flat indices of the ``k`` largest magnitudes; among equal
    magnitudes the lower indices win (a deterministic rule, unlike argpartition's).

    O(n): the k-th largest magnitude ``t`` by a partition, every index above ``t``,
    then the lowest indices equal to ``t`` until there are k.
    """
    n = flat.size
    if k >= n:
        return np.arange(n, dtype=np.uint32)
    if k <= 0:
        return np.zeros(0, np.uint32)
    mag = np.abs(flat)
    t = np.partition(mag, n - k)[n - k]
    above = np.flatnonzero(mag > t)
    ties = np.flatnonzero(mag == t)[: k - above.size]
    idx = np.concatenate([above, ties])
    idx.sort()
    return idx.astype(np.uint32)


class TopK(Codec):
    """Top-k, values as float32 (``quantized=False``) or int8 with one scale."""

    def __init__(self, fraction: float, *, quantized: bool = False, stochastic: bool = False):
        if not (isinstance(fraction, float | int) and 0.0 < fraction <= 1.0):
            raise ValueError(f"topk: fraction must be in (0, 1], got {fraction!r}")
        self.fraction = float(fraction)
        self.quantized = quantized
        self.stochastic = stochastic
        self.id = CodecId.TOPK_INT8 if quantized else CodecId.TOPK
        self.name = (
            f"topk:{fraction:g}" + ("+int8" if quantized else "") + ("-sr" if stochastic else "")
        )

    def _size_for_k(self, k: int) -> int:
        return (8 + 5 * k) if self.quantized else (4 + 8 * k)

    def encoded_size(self, shape: tuple[int, ...]) -> int:
        return self._size_for_k(kept(block_size(shape), self.fraction))

    def payload_size(self, data: bytes | memoryview, shape: tuple[int, ...]) -> int:
        if len(data) < _COUNT.size:
            raise CodecError(f"{self.name}: payload of {len(data)} bytes has no count")
        return self._size_for_k(_COUNT.unpack_from(data, 0)[0])

    def encode(self, x: np.ndarray, *, rng: np.random.Generator | None = None) -> bytes:
        flat = _as_block(x).reshape(-1)
        check_finite(flat, self.name)
        k = kept(flat.size, self.fraction)
        idx = top_indices(flat, k)
        vals = flat[idx]
        head = _COUNT.pack(k) + idx.astype("<u4").tobytes()
        if not self.quantized:
            return head + vals.astype("<f4").tobytes()
        q, scales = quantize(vals.reshape(1, -1), 127, stochastic=self.stochastic, rng=rng)
        return head + scales.astype("<f4").tobytes() + q.tobytes()

    def decode(self, payload: bytes | memoryview, shape: tuple[int, ...]) -> np.ndarray:
        n = block_size(shape)
        if len(payload) < _COUNT.size:
            raise CodecError(f"{self.name}: payload of {len(payload)} bytes has no count")
        (k,) = _COUNT.unpack_from(payload, 0)
        if k > n:
            raise CodecError(f"{self.name}: payload keeps {k} values of a {n}-value block")
        if len(payload) != self._size_for_k(k):
            raise CodecError(
                f"{self.name}: payload has {len(payload)} bytes, k={k} needs {self._size_for_k(k)}"
            )
        idx = np.frombuffer(payload, dtype="<u4", count=k, offset=4)
        if k and (idx[-1] >= n or (k > 1 and not (np.diff(idx.astype(np.int64)) > 0).all())):
            raise CodecError(f"{self.name}: indices not strictly increasing below {n}")
        off = 4 + 4 * k
        if self.quantized:
            scale = np.frombuffer(payload, dtype="<f4", count=1, offset=off).astype(np.float32)
            check_scales(scale, 127, self.name)
            q = np.frombuffer(payload, dtype=np.int8, count=k, offset=off + 4)
            if k and q.min() == -128:
                raise CodecError(f"{self.name}: value -128 is outside the symmetric range")
            vals = q.astype(np.float32) * scale[0]
        else:
            vals = np.frombuffer(payload, dtype="<f4", count=k, offset=off).astype(np.float32)
            if not np.isfinite(vals).all():
                raise CodecError(f"{self.name}: payload holds non-finite values")
        out = np.zeros(n, np.float32)
        out[idx] = vals
        return out.reshape(shape)


register(TopK(0.01))
register(TopK(0.01, quantized=True))

_NAME = re.compile(r"^topk:([0-9.eE+-]+?)(\+int8)?(-sr)?$")


def _parse(name: str) -> Codec | None:
    m = _NAME.match(name)
    if m is None:
        return None
    try:
        fraction = float(m.group(1))
    except ValueError:
        raise CodecError(f"codec {name!r}: {m.group(1)!r} is not a fraction") from None
    if not 0.0 < fraction <= 1.0:
        raise CodecError(f"codec {name!r}: fraction must be in (0, 1]")
    if m.group(3) and not m.group(2):
        raise CodecError(f"codec {name!r}: -sr needs +int8 (plain top-k does not round)")
    return TopK(fraction, quantized=bool(m.group(2)), stochastic=bool(m.group(3)))


register_parser(_parse)
