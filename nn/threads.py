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
    _limiter = threadpool_limits(limits=n)
    import numba  # local: importing nn must stay cheap (no numba at import)

    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    return n


@contextmanager
def threads(n: int) -> Iterator[None]:
    """Temporarily limit BLAS to ``n`` threads (benchmarks compare thread counts)."""
    with threadpool_limits(limits=n):
        yield
