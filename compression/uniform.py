"""Uniform integer codecs: int8, int4 and int2 with a per-row or per-chunk scale.

A symmetric quantiser, exact so that every client writes the same bytes (docs/protocol.md
§11.1 states it to the bit): ``scale = max|x| / L`` (L = 127 for int8, 7 for int4, 1 for
int2) and ``q = round(x / scale)``, both IEEE float32 divisions, ties to even (``np.rint``),
clamped to ``[-L, L]``; a scale of 0 (an all-zero row) gives q = 0; decoding is ``q *
scale``. Stochastic rounding (``-sr``, unbiased) is ``q = floor(float32(x / scale + u))``
with one uniform float32 ``u`` per value in row-major order from the caller's generator (a
client passes the portable one of its task, §12.1). Per-row scales (``int8``, ``int4``,
``int2``) follow the neuron rows of a W block; per-chunk (``-chunk``) spends only one float.

Byte layouts (little-endian; ``rows`` = first dimension of a 2-D block, 1 for 1-D; ``n`` =
number of values):

* ``int8`` / ``int8-chunk``: ``<{rows}f`` scales / ``<f`` scale, then ``<{n}b`` in [-127, 127]
* ``int4`` / ``int4-chunk``: ``<{rows}f`` scales / ``<f`` scale, then ``<{ceil(n/2)}B`` nibbles
* ``int2``: ``<{rows}f`` scales, then ``<{ceil(n/4)}B`` crumbs

A nibble holds ``q + 8`` (1..15), value ``2i`` in the low nibble of byte ``i`` and ``2i+1`` in
the high one; a crumb (2 bits) holds ``q + 2`` (1..3), value ``4i + j`` in bits ``2j, 2j+1``
of byte ``i``; pad nibbles and crumbs are 0. A value of -128, a nibble or crumb of 0, a
nonzero pad, or a negative or non-finite scale is a corrupt payload.
"""

from __future__ import annotations

import re

import numpy as np

from compression.codecs import (
    Codec,
    CodecError,
    CodecId,
    _as_block,
    block_rows,
    block_size,
    check_finite,
    default_rng,
    register,
    register_parser,
)


def quantize(
    x2d: np.ndarray,
    levels: int,
    *,
    stochastic: bool = False,
    rng: np.random.Generator | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Quantise each row of ``x2d`` to ``[-levels, levels]``: ``(q int8, scales f32)``."""
    absmax = np.max(np.abs(x2d), axis=1) if x2d.shape[1] else np.zeros(x2d.shape[0], np.float32)
    scales = (absmax / np.float32(levels)).astype(np.float32)
    # divide rather than multiply by 1/scale: 1/scale overflows for subnormal scales
    y = np.divide(x2d, scales[:, None], out=np.zeros_like(x2d), where=scales[:, None] > 0)
    if stochastic:
        gen = rng if rng is not None else default_rng(x2d)
        y = np.floor(y + gen.random(y.shape, dtype=np.float32))
    else:
        y = np.rint(y)
    q = np.clip(y, -levels, levels).astype(np.int8)
    return q, scales


_F32_MAX = float(np.finfo(np.float32).max)


def check_scales(scales: np.ndarray, levels: int, codec: str) -> None:
    """A scale is finite, >= 0, and small enough that ``levels · scale`` stays finite
    (an encoder never makes one larger, and a larger one would decode to inf)."""
    if scales.size and not ((scales >= 0).all() and (scales <= _F32_MAX / levels).all()):
        raise CodecError(f"{codec}: payload holds a negative, too large or non-finite scale")


def pack_nibbles(q: np.ndarray) -> bytes:
    """Pack int4 values in [-7, 7] two per byte (layout in the module docstring)."""
    u = (q.reshape(-1).astype(np.int16) + 8).astype(np.uint8)
    if u.size % 2:
        u = np.concatenate([u, np.zeros(1, np.uint8)])
    return (u[0::2] | (u[1::2] << 4)).tobytes()


def pack_crumbs(q: np.ndarray) -> bytes:
    """Pack int2 values in [-1, 1] four per byte (layout in the module docstring)."""
    u = (q.reshape(-1).astype(np.int16) + 2).astype(np.uint8)
    u = np.concatenate([u, np.zeros(-u.size % 4, np.uint8)]).reshape(-1, 4)
    return (u[:, 0] | (u[:, 1] << 2) | (u[:, 2] << 4) | (u[:, 3] << 6)).tobytes()


def unpack_crumbs(buf: bytes | memoryview, n: int, codec: str) -> np.ndarray:
    packed = np.frombuffer(buf, dtype=np.uint8)
    u = np.empty((packed.size, 4), np.uint8)
    for j in range(4):
        u[:, j] = (packed >> (2 * j)) & 0x03
    u = u.reshape(-1)
    if u[n:].any():
        raise CodecError(f"{codec}: nonzero pad crumb")
    u = u[:n]
    if n and u.min() == 0:
        raise CodecError(f"{codec}: crumb 0 is not a valid int2 value")
    return u.astype(np.int8) - np.int8(2)


def unpack_nibbles(buf: bytes | memoryview, n: int, codec: str) -> np.ndarray:
    packed = np.frombuffer(buf, dtype=np.uint8)
    u = np.empty(2 * packed.size, np.uint8)
    u[0::2] = packed & 0x0F
    u[1::2] = packed >> 4
    if n % 2 and u[-1] != 0:
        raise CodecError(f"{codec}: nonzero pad nibble")
    u = u[:n]
    if n and u.min() == 0:
        raise CodecError(f"{codec}: nibble 0 is not a valid int4 value")
    return u.astype(np.int8) - np.int8(8)


_LEVELS = {8: 127, 4: 7, 2: 1}
_PACK = {8: lambda q: q.tobytes(), 4: pack_nibbles, 2: pack_crumbs}
_UNPACK = {4: unpack_nibbles, 2: unpack_crumbs}


class UniformCodec(Codec):
    """Symmetric int8/int4/int2 codec; see the module docstring for the layouts."""

    def __init__(
        self, *, codec_id: CodecId, name: str, bits: int, per_row: bool, stochastic: bool = False
    ) -> None:
        if bits not in _LEVELS:
            raise ValueError(f"uniform codec: bits must be 2, 4 or 8, got {bits}")
        self.id = codec_id
        self.name = name
        self.bits = bits
        self.levels = _LEVELS[bits]
        self.per_row = per_row
        self.stochastic = stochastic

    def _value_bytes(self, n: int) -> int:
        return -(-n * self.bits // 8)

    def _num_scales(self, shape: tuple[int, ...]) -> int:
        return block_rows(shape) if self.per_row else 1

    def encoded_size(self, shape: tuple[int, ...]) -> int:
        return 4 * self._num_scales(shape) + self._value_bytes(block_size(shape))

    def encode(self, x: np.ndarray, *, rng: np.random.Generator | None = None) -> bytes:
        x = _as_block(x)
        check_finite(x, self.name)
        if self.per_row:
            x2d = (
                x.reshape(block_rows(x.shape), -1) if x.size else x.reshape(block_rows(x.shape), 0)
            )
        else:
            x2d = x.reshape(1, -1)
        q, scales = quantize(x2d, self.levels, stochastic=self.stochastic, rng=rng)
        body = _PACK[self.bits](q)
        return scales.astype("<f4").tobytes() + body

    def decode(self, payload: bytes | memoryview, shape: tuple[int, ...]) -> np.ndarray:
        n = block_size(shape)
        expected = self.encoded_size(shape)
        if len(payload) != expected:
            raise CodecError(
                f"{self.name} payload has {len(payload)} bytes, shape {shape} needs {expected}"
            )
        ns = self._num_scales(shape)
        scales = np.frombuffer(payload, dtype="<f4", count=ns).astype(np.float32)
        check_scales(scales, self.levels, self.name)
        body = memoryview(payload)[4 * ns :]
        if self.bits == 8:
            q = np.frombuffer(body, dtype=np.int8, count=n)
            if n and q.min() == -128:
                raise CodecError(f"{self.name}: value -128 is outside the symmetric range")
        else:
            q = _UNPACK[self.bits](body, n, self.name)
        q2d = q.reshape(ns, -1) if n else q.reshape(ns, 0)
        return (q2d.astype(np.float32) * scales[:, None]).reshape(shape)


_VARIANTS = {
    "int8": (CodecId.INT8, 8, True),
    "int8-chunk": (CodecId.INT8_CHUNK, 8, False),
    "int4": (CodecId.INT4, 4, True),
    "int4-chunk": (CodecId.INT4_CHUNK, 4, False),
    "int2": (CodecId.INT2, 2, True),
}

for _name, (_id, _bits, _per_row) in _VARIANTS.items():
    register(UniformCodec(codec_id=_id, name=_name, bits=_bits, per_row=_per_row))

_SR = re.compile(r"^(int8|int8-chunk|int4|int4-chunk|int2)-sr$")


def _parse(name: str) -> Codec | None:
    m = _SR.match(name)
    if m is None:
        return None
    codec_id, bits, per_row = _VARIANTS[m.group(1)]
    return UniformCodec(codec_id=codec_id, name=name, bits=bits, per_row=per_row, stochastic=True)


register_parser(_parse)
