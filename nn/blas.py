"""Row-major GEMM for numba kernels: BLAS ``sgemm`` for float32, loops otherwise.

Why bind sgemm ourselves: numba's ``np.dot`` allocates its result and has no
``beta``, so a weight update ``W := W - lr * dZᵀ A`` would need a gradient buffer
and a second pass. Calling ``sgemm`` with ``alpha=-lr, beta=1`` writes the update
straight into ``W``. The function pointer comes from scipy's Cython BLAS capsule
and is registered with LLVM under a fixed symbol name, so kernels that call it
can still be cached on disk (a ctypes pointer would make them uncachable).

The loop fallback serves float64 (the finite-difference check path) and very
small products, where a BLAS call costs more than the arithmetic.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import numpy as np
from llvmlite import binding as _llvm
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import get_cython_function_address, intrinsic

log = logging.getLogger(__name__)


_CYTHON_BLAS = "scipy.linalg.cython_blas"


def _sgemm_address() -> int:
    """The address of scipy's Cython ``sgemm``, without importing ``scipy.linalg``.

    Why: importing ``scipy.linalg`` (which a plain import of its ``cython_blas``
    does first, and numba's check for a BLAS too) costs a client ~0.1-0.15 s of its
    start for modules never used here (numpy.f2py, numpy.ma, numpy.testing among
    them). The extension is loaded from its file instead; a later ``import
    scipy.linalg`` gets the same module from Python's extension cache. Anything
    unexpected falls back to the plain import.
    """
    if _CYTHON_BLAS not in sys.modules:
        try:
            return _capsule_pointer(_load_cython_blas().__pyx_capi__["sgemm"])
        except Exception:  # any surprise: the documented, slower way
            log.debug("loading %s from its file failed", _CYTHON_BLAS, exc_info=True)
    return get_cython_function_address(_CYTHON_BLAS, "sgemm")


def _load_cython_blas() -> ModuleType:
    spec = importlib.util.find_spec("scipy")  # imports the scipy package only: light
    roots = spec.submodule_search_locations if spec is not None else None
    path = next(
        p
        for root in roots or ()
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
        if (p := Path(root, "linalg", f"cython_blas{suffix}")).is_file()
    )
    ext = importlib.util.spec_from_file_location(_CYTHON_BLAS, path)
    assert ext is not None and ext.loader is not None
    module = importlib.util.module_from_spec(ext)
    ext.loader.exec_module(module)
    registered = sys.modules.get(_CYTHON_BLAS) is module  # single-phase init does that
    sys.modules.setdefault(_CYTHON_BLAS, module)
    try:
        # numba checks for a BLAS once, when its target first loads, by importing
        # this module (numba.np.linalg.ensure_blas): found in sys.modules now, it
        # does not import scipy.linalg either.
        import numba.np.arraymath  # noqa: F401
    finally:
        if registered and "scipy.linalg" not in sys.modules:
            # Python's extension cache keeps it: a later import of scipy.linalg gets
            # this module back and binds it to its parent as usual.
            del sys.modules[_CYTHON_BLAS]
    return module


def _capsule_pointer(capsule: object) -> int:
    api = ctypes.pythonapi
    api.PyCapsule_GetName.restype = ctypes.c_char_p
    api.PyCapsule_GetName.argtypes = [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    address = api.PyCapsule_GetPointer(capsule, api.PyCapsule_GetName(capsule))
    if not address:
        raise ValueError(f"{_CYTHON_BLAS}: sgemm has no address")
    return int(address)


_SYMBOL = "crowdgrad_scipy_sgemm"
_llvm.add_symbol(_SYMBOL, _sgemm_address())


@intrinsic
def _sgemm(typingctx, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """Fortran ``sgemm`` with its scalars passed by value: each one is stored in a
    stack slot of the calling function and the slot's address is passed, as
    Fortran wants. Why not arrays for them: three small heap arrays per call
    (flags, sizes, scalars) cost ~65 ns, half of a 16×16×8 product's whole call,
    and ~2.5 % of a medium/16 step (issue 19)."""
    sig = types.void(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)

    def codegen(context, builder, signature, args):
        i8p = ir.IntType(8).as_pointer()
        ptrs = []
        for ty, val in zip(signature.args, args, strict=True):
            if isinstance(ty, types.Array):
                ptr = context.make_array(ty)(context, builder, val).data
            else:
                ptr = cgutils.alloca_once_value(builder, val)  # in the entry block
            ptrs.append(builder.bitcast(ptr, i8p))
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p] * 13), _SYMBOL
        )
        builder.call(fn, ptrs)
        return context.get_dummy_value()

    return sig, codegen


#: Below this many multiply-adds (M·N·K) the loops beat a BLAS call. Why so low:
#: scipy's sgemm answers a 16×16×16 product in ~0.15 µs and a 128×16×10 one in
#: ~0.5-0.9 µs on the 2-core VM, 3-8x faster than these loops (which LLVM does not
#: turn into register tiles), and the crossover measured 64-400 multiply-adds
#: depending on the orientation (issue 19; at 4096 the small preset's 2,560-MAC
#: layers ran on loops and a step took twice as long).
BLAS_MIN_MACS = 128

_N = np.uint8(ord("N"))
_T = np.uint8(ord("T"))


@njit(cache=True, nogil=True)
def _sgemm_rm(ta, tb, alpha, A, B, beta, C):  # pragma: no cover - compiled
    # Row-major C[M,N] = op(A) op(B) is column-major Cᵀ = op(B)ᵀ op(A)ᵀ: swap the
    # operands, keep each one's transpose flag, and every leading dimension is the
    # row stride, so column blocks of a matrix (a neuron group's slice of
    # activations) are passed without a copy.
    M, N = C.shape
    K = A.shape[0] if ta else A.shape[1]
    _sgemm(
        _T if tb else _N,
        _T if ta else _N,
        np.int32(N),
        np.int32(M),
        np.int32(K),
        np.float32(alpha),
        B,
        np.int32(max(B.strides[0] // B.itemsize, B.shape[1], 1)),
        A,
        np.int32(max(A.strides[0] // A.itemsize, A.shape[1], 1)),
        np.float32(beta),
        C,
        np.int32(max(C.strides[0] // C.itemsize, N, 1)),
    )


@njit(cache=True, nogil=True)
def _scale_(C, beta):  # pragma: no cover - compiled
    if beta == 1.0:
        return
    M, N = C.shape
    for m in range(M):
        for n in range(N):
            C[m, n] = 0.0 if beta == 0.0 else C[m, n] * beta


@njit(cache=True, nogil=True)
def _loops_nt(alpha, A, B, C):  # pragma: no cover - compiled
    # C[m,n] += alpha * <A[m,:], B[n,:]>  (the forward pass: X·Wᵀ)
    M, N = C.shape
    K = A.shape[1]
    for m in range(M):
        for n in range(N):
            acc = A[m, 0] * B[n, 0]
            for k in range(1, K):
                acc += A[m, k] * B[n, k]
            C[m, n] += alpha * acc


@njit(cache=True, nogil=True)
def _loops_axpy(ta, tb, alpha, A, B, C):  # pragma: no cover - compiled
    # C[m,:] += alpha * op(A)[m,k] * op(B)[k,:]  (dZ·W and dZᵀ·A: contiguous rows of B)
    M, N = C.shape
    K = A.shape[0] if ta else A.shape[1]
    for m in range(M):
        for k in range(K):
            a = alpha * (A[k, m] if ta else A[m, k])
            if tb:
                for n in range(N):
                    C[m, n] += a * B[n, k]
            else:
                Bk = B[k]
                Cm = C[m]
                for n in range(N):
                    Cm[n] += a * Bk[n]


@njit(cache=True, nogil=True)
def _loops_tt(alpha, A, B, C):  # pragma: no cover - compiled
    # C[m,n] += alpha * Σ_k A[k,m]·B[n,k] (the output layer of feature-major
    # activations): a column of C is summed in a contiguous buffer and written once,
    # so the inner loop runs along rows of A instead of striding through C.
    M, N = C.shape
    K = A.shape[0]
    col = np.empty(M, C.dtype)
    for n in range(N):
        for m in range(M):
            col[m] = 0
        for k in range(K):
            b = alpha * B[n, k]
            Ak = A[k]
            for m in range(M):
                col[m] += Ak[m] * b
        for m in range(M):
            C[m, n] += col[m]


@njit(cache=True, nogil=True)
def gemm(ta, tb, alpha, A, B, beta, C):  # pragma: no cover - compiled
    """``C := alpha·op(A)·op(B) + beta·C`` on row-major 2-D arrays.

    Rows must be contiguous (inner stride 1); the row stride may be larger, as in
    a column block ``Z[:, j0:j1]``.

    ``beta == 0`` ignores what C held (even NaN), as BLAS does. Shapes are the
    caller's contract: kernels derive them from one layout, so they are not
    re-checked here.
    """
    M, N = C.shape
    K = A.shape[0] if ta else A.shape[1]
    if C.itemsize == 4 and M * N * K >= BLAS_MIN_MACS:
        _sgemm_rm(ta, tb, alpha, A, B, beta, C)
        return
    _scale_(C, beta)
    if not ta and tb:
        _loops_nt(alpha, A, B, C)
    elif ta and tb:
        _loops_tt(alpha, A, B, C)
    else:
        _loops_axpy(ta, tb, alpha, A, B, C)


# -- the thread count of the BLAS behind sgemm ----------------------------------------


_controllers: list | None = None


def _blas_controllers() -> list:
    # Every BLAS in the process, not only scipy's: the sgemm capsule points into
    # scipy's Cython wrapper, not into the library, so the loader cannot say which
    # one it calls. Numpy's BLAS is pinned alongside for the duration of a call.
    global _controllers
    if _controllers is None:
        from threadpoolctl import ThreadpoolController

        _controllers = [c for c in ThreadpoolController().lib_controllers if c.user_api == "blas"]
    return _controllers


@contextmanager
def sgemm_threads(n: int) -> Iterator[None]:
    """Run sgemm with ``n`` threads inside the block, then restore the old count.

    Why: neuron-group kernels call sgemm from several numba threads at once, each
    on its own rows; a multi-threaded BLAS would then start its own pool inside
    every call and oversubscribe the cores. Not safe against another Python thread
    changing the same library's thread count at the same time.
    """
    libs = _blas_controllers()
    before = [c.get_num_threads() for c in libs]
    for c in libs:
        c.set_num_threads(n)
    try:
        yield
    finally:
        for c, k in zip(libs, before, strict=True):
            c.set_num_threads(k)
