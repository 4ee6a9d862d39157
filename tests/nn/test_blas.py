"""gemm: both code paths (sgemm and loops) against numpy for every transpose."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nn.blas import BLAS_MIN_MACS, _blas_controllers, gemm, sgemm_threads


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 40),
    n=st.integers(1, 40),
    k=st.integers(1, 40),
    ta=st.booleans(),
    tb=st.booleans(),
    beta=st.sampled_from([0.0, 1.0, 0.5]),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**16),
)
def test_gemm_matches_numpy(m, n, k, ta, tb, beta, dtype, seed) -> None:
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
    B = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
    C = rng.standard_normal((m, n)).astype(dtype)
    want = -0.7 * (A.T if ta else A).astype(np.float64) @ (B.T if tb else B) + beta * C
    gemm(ta, tb, -0.7, A, B, beta, C)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(C, want, rtol=tol, atol=tol * k)


def test_beta_zero_ignores_nan_in_c() -> None:
    for m in (2, 64):  # loops and sgemm
        assert m * m * m < BLAS_MIN_MACS or m == 64
        A = np.ones((m, m), np.float32)
        C = np.full((m, m), np.nan, np.float32)
        gemm(False, False, 1.0, A, A, 0.0, C)
        assert (m == C).all()


@pytest.mark.parametrize(("ta", "tb"), [(False, True), (False, False), (True, False)])
def test_gemm_on_column_blocks_uses_the_row_stride(ta: bool, tb: bool) -> None:
    # Neuron groups pass Z[:, j0:j1] and dZ[:, j0:j1]: rows contiguous, stride wider.
    rng = np.random.default_rng(0)
    m, n, k = 24, 40, 36
    Abig = rng.standard_normal((k + 5, m + 7) if ta else (m + 5, k + 7)).astype(np.float32)
    A = Abig[:k, 3 : 3 + m] if ta else Abig[:m, 3 : 3 + k]
    B = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    Cbig = rng.standard_normal((m, n + 9)).astype(np.float32)
    C = Cbig[:, 4 : 4 + n]
    outside = Cbig[:, :4].copy(), Cbig[:, 4 + n :].copy()
    want = 0.5 * (A.T if ta else A).astype(np.float64) @ (B.T if tb else B) + C
    gemm(ta, tb, 0.5, A, B, 1.0, C)
    np.testing.assert_allclose(C, want, rtol=1e-5, atol=1e-5 * k)
    assert np.array_equal(Cbig[:, :4], outside[0]) and np.array_equal(Cbig[:, 4 + n :], outside[1])


def test_sgemm_threads_pins_and_restores() -> None:
    libs = _blas_controllers()
    assert libs, "threadpoolctl found no BLAS"
    before = [c.get_num_threads() for c in libs]
    with sgemm_threads(1):
        assert all(c.get_num_threads() == 1 for c in libs)
    assert [c.get_num_threads() for c in libs] == before


def test_sgemm_is_bound_without_importing_scipy_linalg() -> None:
    """nn.blas takes scipy's sgemm without ``scipy.linalg`` (a client's start), nor
    does numba's first dispatch import it then; it is the same function the plain
    import gives, and a later ``import scipy.linalg`` sees its ``cython_blas``."""
    code = (
        "import sys, nn.blas as b; from nn.rng import Xoshiro128ss;"
        "Xoshiro128ss(1).normal(4); print('scipy.linalg' in sys.modules);"
        "import scipy.linalg; print(hasattr(scipy.linalg, 'cython_blas'));"
        "from numba.extending import get_cython_function_address as g;"
        "print(g('scipy.linalg.cython_blas', 'sgemm') == b._sgemm_address())"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    )
    assert out.stdout.split() == ["False", "True", "True"]
