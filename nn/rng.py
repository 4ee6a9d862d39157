"""A portable random generator: xoshiro128** with a 32-bit seeding rule.

A client in another language (a browser, a game script) must draw exactly the same batches and
initial weights as this one, so everything here uses only 32-bit integer operations and
float64 arithmetic that is exact. docs/protocol.md §12.1 is the specification; the conformance
vectors in ``tests/vectors/compute/rng.json`` pin it (why not NumPy's: docs/decisions.md).

* ``seed_state``: ``(seed, stream)`` → four state words by two rounds of murmur3's ``fmix32``;
  distinct pairs give distinct states, and never xoshiro's forbidden all-zero one.
* ``next_u32``: xoshiro128** 1.1 (Blackman & Vigna).
* ``below(n)``: uniform in ``[0, n)`` by rejection; ``permutation(n)``: Fisher–Yates from the
  top; ``normal``: Irwin–Hall with 12 terms (bit-exact everywhere; tails end at ±6).

The bulk draws are numba kernels; the state is a small int64 array holding four uint32 values,
advanced in place.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: mask of a 32-bit word
M32 = 0xFFFFFFFF
#: 2³² / φ, the additive constant of the seeding rounds
GOLDEN = 0x9E3779B9


def fmix32(h: int) -> int:
    """murmur3's 32-bit finaliser: a bijection of uint32 with full avalanche."""
    h &= M32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    h ^= h >> 16
    return h


def seed_state(seed: int, stream: int) -> tuple[int, int, int, int]:
    """The four state words for a 64-bit ``seed`` and a 32-bit ``stream``.

    ``(a, b, c, d) = (seed mod 2³², seed >> 32, stream, 0x9E3779B9)``, then twice:
    ``a = fmix32(a ^ d); b = fmix32(b ^ a); c = fmix32(c ^ b); d = fmix32(d ^ c)``.
    Two rounds make every word depend on every input bit (the first output of
    xoshiro128** reads only the second word).
    """
    if not 0 <= seed < 1 << 64:
        raise ValueError(f"seed: must be in [0, 2**64), got {seed}")
    if not 0 <= stream < 1 << 32:
        raise ValueError(f"stream: must be in [0, 2**32), got {stream}")
    a, b, c, d = seed & M32, seed >> 32, stream, GOLDEN
    for _ in range(2):
        a = fmix32(a ^ d)
        b = fmix32(b ^ a)
        c = fmix32(c ^ b)
        d = fmix32(d ^ c)
    return a, b, c, d


# -- kernels: the state is int64[4] holding uint32 values ------------------------------


@njit(cache=True, nogil=True, inline="always")
def _step(s0, s1, s2, s3):  # pragma: no cover - compiled
    """One xoshiro128** step: ``(output, s0, s1, s2, s3)``. No product exceeds 2⁴⁰."""
    x = (s1 * 5) & 0xFFFFFFFF
    r = ((((x << 7) | (x >> 25)) & 0xFFFFFFFF) * 9) & 0xFFFFFFFF
    t = (s1 << 9) & 0xFFFFFFFF
    s2 ^= s0
    s3 ^= s1
    s1 ^= s2
    s0 ^= s3
    s2 ^= t
    s3 = ((s3 << 11) | (s3 >> 21)) & 0xFFFFFFFF
    return r, s0, s1, s2, s3


@njit(cache=True, nogil=True)
def _fill_u32(s, out):  # pragma: no cover - compiled
    s0, s1, s2, s3 = s[0], s[1], s[2], s[3]
    for k in range(out.shape[0]):
        r, s0, s1, s2, s3 = _step(s0, s1, s2, s3)
        out[k] = r
    s[0], s[1], s[2], s[3] = s0, s1, s2, s3


@njit(cache=True, nogil=True)
def _below(s, n):  # pragma: no cover - compiled
    """Uniform in [0, n), 1 <= n <= 2³²: reject words below (2³² − n) mod n."""
    threshold = ((1 << 32) - n) % n
    s0, s1, s2, s3 = s[0], s[1], s[2], s[3]
    while True:
        r, s0, s1, s2, s3 = _step(s0, s1, s2, s3)
        if r >= threshold:
            break
    s[0], s[1], s[2], s[3] = s0, s1, s2, s3
    return r % n


@njit(cache=True, nogil=True)
def _permutation(s, n):  # pragma: no cover - compiled
    a = np.arange(n)
    for i in range(n - 1, 0, -1):
        j = _below(s, i + 1)
        a[i], a[j] = a[j], a[i]
    return a


@njit(cache=True, nogil=True)
def _fill_normal(s, out, scale):  # pragma: no cover - compiled
    """``out[k] = float32(z·scale)``, z = (sum of 12 words)·2⁻³² − 6, exact in float64."""
    s0, s1, s2, s3 = s[0], s[1], s[2], s[3]
    for k in range(out.shape[0]):
        acc = 0
        for _ in range(12):
            r, s0, s1, s2, s3 = _step(s0, s1, s2, s3)
            acc += r
        z = acc * 2.3283064365386963e-10 - 6.0  # 2**-32
        out[k] = np.float32(z * scale)
    s[0], s[1], s[2], s[3] = s0, s1, s2, s3


@njit(cache=True, nogil=True)
def _fill_uniform_f32(s, out):  # pragma: no cover - compiled
    """``out[k] = (word >> 8)·2⁻²⁴``: the 24 bits a float32 in [0, 1) holds exactly."""
    s0, s1, s2, s3 = s[0], s[1], s[2], s[3]
    for k in range(out.shape[0]):
        r, s0, s1, s2, s3 = _step(s0, s1, s2, s3)
        out[k] = np.float32((r >> 8) * 5.960464477539063e-08)  # 2**-24
    s[0], s[1], s[2], s[3] = s0, s1, s2, s3


class Xoshiro128ss:
    """xoshiro128** seeded from ``(seed, stream)``; see the module docstring.

    Duck-compatible with the two ``numpy.random.Generator`` methods the nn and
    compression code call: ``permutation(n)`` (int64) and ``random(shape,
    dtype=np.float32)``, so either generator can be passed there.
    """

    __slots__ = ("_s",)

    def __init__(self, seed: int, stream: int = 0) -> None:
        self._s = np.array(seed_state(int(seed), int(stream)), dtype=np.int64)

    @property
    def state(self) -> tuple[int, int, int, int]:
        return tuple(int(v) for v in self._s)  # type: ignore[return-value]

    def next_u32(self) -> int:
        out = np.empty(1, np.int64)
        _fill_u32(self._s, out)
        return int(out[0])

    def u32(self, n: int) -> np.ndarray:
        """The next ``n`` outputs as uint32."""
        out = np.empty(int(n), np.int64)
        _fill_u32(self._s, out)
        return out.astype(np.uint32)

    def below(self, n: int) -> int:
        """Uniform integer in ``[0, n)``, ``1 <= n <= 2**32`` (draws at least one word)."""
        if not 1 <= n <= 1 << 32:
            raise ValueError(f"below: n must be in [1, 2**32], got {n}")
        return int(_below(self._s, int(n)))

    def permutation(self, n: int, /) -> np.ndarray:
        """Fisher–Yates: ``a = 0..n-1``; for i = n−1 down to 1, swap a[i], a[below(i+1)]."""
        if not 0 <= n <= 1 << 32:
            raise ValueError(f"permutation: n must be in [0, 2**32], got {n}")
        return _permutation(self._s, int(n))

    def normal_into(self, out: np.ndarray, scale: float) -> None:
        """Fill a 1-D float32 array with Irwin–Hall normals times ``scale`` (float64)."""
        if out.dtype != np.float32 or out.ndim != 1:
            raise ValueError("normal_into: out must be a 1-D float32 array")
        _fill_normal(self._s, out, float(scale))

    def normal(self, n: int, scale: float = 1.0) -> np.ndarray:
        out = np.empty(int(n), np.float32)
        self.normal_into(out, scale)
        return out

    def random(self, size: int | tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
        """Uniform float32 in [0, 1): ``(next_u32 >> 8)·2⁻²⁴`` (stochastic rounding)."""
        if np.dtype(dtype) != np.float32:
            raise ValueError(f"random: only float32 is portable, got {np.dtype(dtype)}")
        shape = (size,) if isinstance(size, int) else tuple(size)
        out = np.empty(int(np.prod(shape, dtype=np.int64)), np.float32)
        _fill_uniform_f32(self._s, out)
        return out.reshape(shape)

    def __repr__(self) -> str:
        return "Xoshiro128ss(state=({:#010x}, {:#010x}, {:#010x}, {:#010x}))".format(*self.state)
