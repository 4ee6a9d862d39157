"""Process-wide settings that only an entry point may make (the CLI's ``main``).

Libraries never call these: a game backend that mounts the coordinator keeps its
own allocator and thread settings.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator

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


#: What OpenBLAS reads, once, when it loads, for the number of threads to start.
OPENBLAS_THREADS_VAR = "OPENBLAS_NUM_THREADS"


@contextlib.contextmanager
def openblas_threads(n: int) -> Iterator[None]:
    """Every OpenBLAS loaded inside starts ``n`` threads (``OPENBLAS_NUM_THREADS``,
    unless the user set it); the environment is as it was after, so the processes
    this one starts see the user's.

    Why: an OpenBLAS starts a worker per core when it loads, and each new worker
    spins for OpenBLAS's thread timeout (about 0.1 s of a core) before it sleeps.
    numpy and scipy each load their own, and ``nn.threads.set_threads`` can only
    limit a library that is loaded, so before this each start of a crowdgrad
    command burnt ~0.2 s of CPU on workers that never ran a GEMM (on two cores,
    one ``crowdgrad client`` alone to its first connect: 0.58 s of CPU, 0.36 s
    with this, medians of 6). The spin is timed on the clock, so on a machine
    that is busy anyway it takes less, but it takes it from the other processes.
    """
    if OPENBLAS_THREADS_VAR in os.environ:
        yield
        return
    os.environ[OPENBLAS_THREADS_VAR] = str(int(n))
    try:
        yield
    finally:
        os.environ.pop(OPENBLAS_THREADS_VAR, None)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """CPython's cyclic collector off while an entry point starts (its imports),
    back as it was after.

    Why: importing numba, numpy, FastAPI and pydantic makes some 80,000-115,000
    objects the collector tracks, nearly all staying alive, and it walks them
    again and again as they pile up, finding almost nothing. Call ``tune_gc`` inside,
    at the end of the start: it freezes what the start built, so neither the
    first collection after it (which would walk everything allocated while
    paused) nor any later one walks it. Measured alone on two cores, medians of
    8: a client's start 0.36 -> 0.33 s of CPU, a coordinator's to serving 0.78 ->
    0.74 s (pausing without the freeze inside gained nothing for the client).
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


#: Allocations between young collections.
_GC_GEN0 = 10_000
#: Seconds between freezing what survived, and between full collections.
GC_FREEZE_EVERY_S = 1.0
GC_FULL_EVERY_S = 600.0
#: A full collection comes sooner once the heap grew by this many times what the
#: last one left (plus GC_GROWTH_SLACK), counted in the small-object allocator's
#: blocks (``sys.getallocatedblocks``): garbage in cycles, from clients that came
#: and went, as large as everything alive.
GC_GROWTH = 1.0
GC_GROWTH_SLACK = 400_000

_gc_thread: threading.Thread | None = None


def tune_gc(
    *, freeze_every: float = GC_FREEZE_EVERY_S, full_every: float = GC_FULL_EVERY_S
) -> threading.Thread:
    """Keep CPython's collector from pausing a coordinator that holds thousands of
    connections; returns the (daemon) thread that does it. Idempotent.

    Each connection keeps over a hundred objects alive (its websocket protocol,
    the coroutine and future of every read and write it waits on), so 10,000
    clients hold over a million. CPython collects a generation by walking all of
    it: a full collection then takes about a second, and the middle generation,
    where the futures of reads waiting out a 5 s heartbeat pile up, 30 to 200 ms;
    no heartbeat is answered meanwhile (benchmarks/coordinator_load.py, 10,000
    clients: heartbeat p99 0.1 to 1.7 s with CPython's defaults, 100 to 350 ms
    with rare full collections alone, 20 to 80 ms with this).

    So every ``freeze_every`` seconds whatever survived is frozen (``gc.freeze``:
    moved out of every generation, a constant-time splice), and collections only
    ever walk what was allocated since. Frozen objects are still freed by reference
    counting, which frees nearly all of them (10,000 clients leaving leave about 6
    objects each in reference cycles); those cycles wait for the full collection
    run every ``full_every`` seconds (unfreeze, collect, freeze; ten minutes by
    default), the one pause left, or sooner once the heap has grown by
    ``GC_GROWTH`` times what the last one kept (a crowd that churns: the cycles of
    60,000 hostile connections in 90 s held 270 MB until then).

    The heap is measured in allocated blocks, not ``gc.get_freeze_count()``: that
    walks the whole frozen list with the GIL held (about 0.1 s a second, a tenth
    of the process's core, at 10,000 clients); the blocks are summed per 4 KiB
    pool, about a hundred times fewer reads (docs/performance.md).
    """
    global _gc_thread
    if not freeze_every > 0 or not full_every >= freeze_every:
        raise ValueError(
            f"tune_gc: need 0 < freeze_every <= full_every, got {freeze_every!r}, {full_every!r}"
        )
    if _gc_thread is not None:
        return _gc_thread
    gc.freeze()
    gc.set_threshold(_GC_GEN0, 10, 10)

    def run() -> None:
        last_full = time.monotonic()
        kept = sys.getallocatedblocks()  # what the last full collection left
        while True:
            time.sleep(freeze_every)
            now = time.monotonic()
            if full_collection_due(sys.getallocatedblocks(), kept, now - last_full, full_every):
                gc.unfreeze()
                found = gc.collect()
                last_full = time.monotonic()
                gc.freeze()
                kept = sys.getallocatedblocks()
                log.debug("full collection: %d unreachable, %d blocks kept", found, kept)
            gc.freeze()

    _gc_thread = threading.Thread(target=run, name="crowdgrad-gc", daemon=True)
    _gc_thread.start()
    return _gc_thread


def full_collection_due(blocks: int, kept: int, since_full: float, full_every: float) -> bool:
    """``tune_gc``'s rule: a full collection once ``full_every`` seconds passed since
    the last, or once the heap (``blocks`` allocated now) grew past ``GC_GROWTH``
    times the ``kept`` blocks the last one left, plus ``GC_GROWTH_SLACK``."""
    return since_full >= full_every or blocks > kept * (1 + GC_GROWTH) + GC_GROWTH_SLACK
