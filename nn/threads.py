"""How many threads the nn core may use: numba's pool and the BLAS behind sgemm.

Why this is explicit: OpenBLAS starts one spinning thread per core by default.
A volunteer client shares its machine with a game, a coordinator shares its two
cores with the network thread, and a test run starts several processes at once;
an oversubscribed BLAS pool then runs small GEMMs tens of times slower. So every
process that computes says how many threads it wants (one, unless it measures a
benefit), and benchmarks say so too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from threadpoolctl import threadpool_limits

_limiter: threadpool_limits | None = None

#: Spins of a GNU OpenMP thread at a barrier before it sleeps (``GOMP_SPINCOUNT``).
OMP_SPIN_COUNT = 30_000


def bound_omp_spin() -> None:
    """Make GNU OpenMP spin briefly at a barrier, then sleep, unless the user chose
    (``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` set). Call before libgomp loads
    (numba's first parallel region; ``import torch``): it reads them once.

    Why: neuron-group regions end in a barrier. libgomp's default spins ~300,000
    times there, and on a shared machine the spinner burns the timeslice its
    descheduled partner needs (large/16 on 2 threads at load 5 ran 4x slower than
    on one thread). Sleeping at once (``OMP_WAIT_POLICY=PASSIVE``, the earlier
    choice) fixed that but costs a wake-up per region, which on a VM means waking
    a halted vCPU: on an AMD EPYC VM large/16 ran 428-432 steps/s passive against
    499-521 with 30,000-100,000 spins, large/128 74-79 % against 82-83 % of the
    GEMM-bound rate, and 30,000 spins also beat passive with 2 and 4 busy
    processes beside it (docs/performance.md, "Bounded spin").
    """
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = str(OMP_SPIN_COUNT)


def default_threads() -> int:
    """``CROWDGRAD_THREADS`` when set, else 1 (see the module docstring)."""
    raw = os.environ.get("CROWDGRAD_THREADS", "1")
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"CROWDGRAD_THREADS: expected an integer >= 1, got {raw!r}") from None
    if n < 1:
        raise ValueError(f"CROWDGRAD_THREADS: expected an integer >= 1, got {n}")
    return n


def set_threads(n: int | None = None) -> int:
    """Limit BLAS and numba to ``n`` threads for the rest of the process; returns n."""
    global _limiter
    n = default_threads() if n is None else int(n)
    if n < 1:
        raise ValueError(f"threads: expected an integer >= 1, got {n}")
    # threadpoolctl limits only the libraries loaded now: load scipy's OpenBLAS
    # (the sgemm the kernels call) first, or it keeps one thread per core; nn.blas
    # loads it without importing scipy.linalg (a client's start)
    import nn.blas  # noqa: F401

    _limiter = threadpool_limits(limits=n)
    import numba  # local: importing nn must stay cheap (no numba at import)

    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    return n


@contextmanager
def threads(n: int) -> Iterator[None]:
    """Temporarily limit BLAS to ``n`` threads (benchmarks compare thread counts)."""
    with threadpool_limits(limits=n):
        yield
