"""Process-wide settings that only an entry point may make (the CLI's ``main``).

Libraries never call these: a game backend that mounts the coordinator keeps its
own allocator and thread settings.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import sys

log = logging.getLogger(__name__)

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit).
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024


def tune_malloc() -> bool:
    """Keep freed multi-MB frame buffers in the heap instead of returning them.

    Every model chunk is a fresh bytes object of up to 16 MiB; by default glibc
    maps each from the kernel and unmaps it when freed, so encoding one is paid
    again in page faults (on a VM several times the copy itself). Raising the
    mmap and trim thresholds keeps those pages for the next frame, as the
    MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ variables would. Returns False
    where there is no glibc.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, 4 * _MMAP_THRESHOLD_MAX)
    )
    if not ok:
        log.debug("mallopt refused the frame-buffer thresholds; keeping glibc defaults")
    return ok


#: Allocations between young collections, and young collections between full ones.
_GC_GEN0 = 10_000
_GC_FULL_EVERY = 1_000


def tune_gc() -> None:
    """Make CPython's full garbage collections rare in a long-running coordinator.

    A coordinator holding 10,000 connections has millions of long-lived objects;
    each full collection walks all of them, about a second during which no
    heartbeat is answered (benchmarks/coordinator_load.py: heartbeat p99 0.1 to
    1.7 s at 10,000 clients with the defaults, 52 to 66 ms with this). The
    objects alive after start-up are frozen out of collection, young collections
    still free short-lived cycles, and a full collection runs after
    ``_GC_FULL_EVERY`` middle-generation ones instead of 10.
    """
    gc.freeze()
    gc.set_threshold(_GC_GEN0, 10, _GC_FULL_EVERY)
