"""nn.rng against a plain-Python reference, and its properties (docs/protocol.md §12.1)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nn.rng import GOLDEN, M32, Xoshiro128ss, fmix32, seed_state

SEEDS = st.integers(0, 2**64 - 1)
STREAMS = st.integers(0, 2**32 - 1)


class Reference:
    """xoshiro128** written from the paper's C, one word at a time."""

    def __init__(self, seed: int, stream: int) -> None:
        self.s = list(seed_state(seed, stream))

    @staticmethod
    def rotl(x: int, k: int) -> int:
        return ((x << k) | (x >> (32 - k))) & M32

    def next(self) -> int:
        s = self.s
        result = (self.rotl((s[1] * 5) & M32, 7) * 9) & M32
        t = (s[1] << 9) & M32
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = self.rotl(s[3], 11)
        return result

    def below(self, n: int) -> int:
        while True:
            x = self.next()
            if x >= (2**32 - n) % n:
                return x % n

    def permutation(self, n: int) -> list[int]:
        a = list(range(n))
        for i in range(n - 1, 0, -1):
            j = self.below(i + 1)
            a[i], a[j] = a[j], a[i]
        return a


def test_xoshiro_reference_outputs() -> None:
    """Vigna's xoshiro128** from state (1, 2, 3, 4): 11520, 0, 5927040, ..."""
    g = Xoshiro128ss(0)
    g._s[:] = (1, 2, 3, 4)
    assert g.u32(4).tolist() == [11520, 0, 5927040, 70819200]


def _unfmix32(h: int) -> int:
    h ^= h >> 16
    h = (h * pow(0xC2B2AE35, -1, 2**32)) & M32
    h ^= (h >> 13) ^ (h >> 26)
    h = (h * pow(0x85EBCA6B, -1, 2**32)) & M32
    h ^= h >> 16
    return h


@given(st.integers(0, M32))
def test_fmix32_is_a_bijection_fixing_zero(h: int) -> None:
    assert _unfmix32(fmix32(h)) == h and fmix32(0) == 0


@given(SEEDS, STREAMS)
def test_seeding_is_invertible_and_never_zero(seed: int, stream: int) -> None:
    a, b, c, d = seed_state(seed, stream)
    for _ in range(2):  # undo the rounds
        d = _unfmix32(d) ^ c
        c = _unfmix32(c) ^ b
        b = _unfmix32(b) ^ a
        a = _unfmix32(a) ^ d
    assert (a, b, c, d) == (seed & M32, seed >> 32, stream, GOLDEN)
    assert any(seed_state(seed, stream))


@settings(max_examples=50, deadline=None)  # the first example compiles
@given(SEEDS, STREAMS)
def test_kernels_match_the_reference(seed: int, stream: int) -> None:
    g, ref = Xoshiro128ss(seed, stream), Reference(seed, stream)
    assert g.u32(16).tolist() == [ref.next() for _ in range(16)]
    assert g.permutation(20).tolist() == ref.permutation(20)
    assert g.below(1000) == ref.below(1000)
    words = [ref.next() for _ in range(24)]
    want = [np.float32((sum(words[k : k + 12]) * 2.0**-32 - 6.0) * 0.5) for k in (0, 12)]
    assert g.normal(2, 0.5).tolist() == [float(w) for w in want]


@settings(deadline=None)
@given(SEEDS, STREAMS, st.integers(1, 2**32))
def test_below_stays_in_range(seed: int, stream: int, n: int) -> None:
    g = Xoshiro128ss(seed, stream)
    assert all(0 <= g.below(n) < n for _ in range(8))


@settings(deadline=None)
@given(SEEDS, st.integers(0, 300))
def test_permutation_is_a_permutation(seed: int, n: int) -> None:
    p = Xoshiro128ss(seed, 0).permutation(n)
    assert p.dtype == np.int64 and sorted(p.tolist()) == list(range(n))


def test_below_is_unbiased_where_modulo_would_not_be() -> None:
    """n = 3·2³⁰: a plain ``word % n`` would give [0, 2³⁰) twice the weight."""
    n = 3 * 2**30
    g = Xoshiro128ss(1)
    draws = np.array([g.below(n) for _ in range(30000)])
    low = (draws < 2**30).mean()
    assert abs(low - 1 / 3) < 0.02  # modulo: 1/2


def test_same_seed_same_stream_same_draws_and_streams_differ() -> None:
    assert Xoshiro128ss(5, 1).u32(8).tolist() == Xoshiro128ss(5, 1).u32(8).tolist()
    assert Xoshiro128ss(5, 1).u32(8).tolist() != Xoshiro128ss(5, 2).u32(8).tolist()
    assert Xoshiro128ss(5, 1).u32(8).tolist() != Xoshiro128ss(2**32 + 5, 1).u32(8).tolist()


def test_uniform_floats_and_bad_arguments() -> None:
    u = Xoshiro128ss(3, 1).random((4, 5))
    assert u.dtype == np.float32 and u.shape == (4, 5) and ((u >= 0) & (u < 1)).all()
    g = Xoshiro128ss(3, 1)
    assert (u.ravel() * 2**24 == (g.u32(20) >> 8)).all()
    bad = [
        lambda: Xoshiro128ss(-1),
        lambda: Xoshiro128ss(0, 2**32),
        lambda: Xoshiro128ss(0).below(0),
        lambda: Xoshiro128ss(0).random(3, np.float64),
    ]
    for call in bad:
        with pytest.raises(ValueError):
            call()


def test_normal_moments() -> None:
    z = Xoshiro128ss(9).normal(200_000, 1.0).astype(np.float64)
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1.0) < 0.01 and np.abs(z).max() <= 6.0
