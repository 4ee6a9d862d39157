"""Process-wide settings that only an entry point may make (the CLI's ``main``).

Libraries never call these: a game backend that mounts the coordinator keeps its
own allocator and thread settings.
"""

from __future__ import annotations

import ctypes
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
