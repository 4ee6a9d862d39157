"""Run the desktop client's compute at idle priority: a game beside it keeps its frames.

An idle-priority thread runs only when nothing else wants the core. What each platform gets,
for the calling thread only (the IO thread that keeps heartbeats flowing stays at normal
priority):

- Linux: ``SCHED_IDLE`` (``sched_setscheduler`` on the thread's own id), else nice 19 for that
  thread (``setpriority`` on a TID is per-thread on Linux, unlike POSIX).
- macOS: the background QoS class (``pthread_set_qos_class_self_np``), which also throttles IO.
- Windows: ``THREAD_PRIORITY_IDLE`` (``SetThreadPriority``).

Threads the compute thread starts later inherit its policy on Linux (numba's OpenMP pool);
native pools started before it, from the main thread (OpenBLAS, numba's workqueue), do not, so
:func:`lower_native_pools` lowers every thread the ``threading`` module does not know about
(Linux: ``/proc/self/task``). Everything here is best effort: a refusal is logged, never
raised. Why, per platform and per pool: docs/client.md ("Idle priority"); what it measured:
docs/performance.md ("The frame budget").
"""

from __future__ import annotations

import ctypes
import enum
import logging
import os
import sys
import threading

log = logging.getLogger(__name__)

#: nice value of the fallback (the lowest)
LOWEST_NICE = 19
#: macOS ``qos_class_t`` QOS_CLASS_BACKGROUND (sys/qos.h)
_QOS_CLASS_BACKGROUND = 0x09
#: Windows THREAD_PRIORITY_IDLE (processthreadsapi.h)
_THREAD_PRIORITY_IDLE = -15


class Priority(enum.Enum):
    """``--priority``: ``idle`` (default) runs compute only on otherwise idle CPU."""

    NORMAL = "normal"
    IDLE = "idle"


def lower_this_thread() -> str:
    """Put the calling thread at the lowest priority this platform offers; returns
    what was applied (``"SCHED_IDLE"``, ``"nice 19"``, ...) or ``"none"``."""
    tid = threading.get_native_id()
    if sys.platform.startswith("linux"):
        return _lower_linux(tid)
    if sys.platform == "darwin":
        return _lower_macos()
    if sys.platform == "win32":
        return _lower_windows()
    log.warning("compute priority: no idle class known on %s; computing at normal", sys.platform)
    return "none"


def lower_native_pools() -> list[int]:
    """Lower every thread of this process that ``threading`` does not know (BLAS and
    numba pools started by native code); returns their ids. Linux only (elsewhere
    there is no portable way to list them): [] on other platforms."""
    if not sys.platform.startswith("linux"):
        return []
    known = {t.native_id for t in threading.enumerate()}
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []
    lowered = []
    for tid in tids:
        if tid not in known and tid != os.getpid() and _lower_linux(tid, quiet=True) != "none":
            lowered.append(tid)
    return lowered


def apply(priority: Priority, *, pools: bool = False) -> str:
    """The compute thread's initializer: at ``IDLE`` lower it (and, with ``pools``,
    the native pools: only in a process the client owns) and log what was applied
    (INFO; a WARNING when nothing could be). Returns what was applied."""
    if priority is Priority.NORMAL:
        log.info("compute priority: normal (--priority normal)")
        return "none"
    what = lower_this_thread()
    lowered = lower_native_pools() if pools else []
    if what != "none":
        log.info("compute priority: %s (and %d native pool threads)", what, len(lowered))
    return what


def _lower_linux(tid: int, *, quiet: bool = False) -> str:
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        return "SCHED_IDLE"
    except (OSError, AttributeError) as exc:  # a seccomp filter, an old kernel
        idle_error = exc
    try:
        os.setpriority(os.PRIO_PROCESS, tid, LOWEST_NICE)
        return f"nice {LOWEST_NICE}"
    except OSError as exc:
        if not quiet:
            log.warning(
                "compute priority: SCHED_IDLE refused (%s), nice %d refused (%s): "
                "computing at normal priority",
                idle_error,
                LOWEST_NICE,
                exc,
            )
        return "none"


def _lower_macos() -> str:
    try:
        libc = ctypes.CDLL("/usr/lib/libSystem.B.dylib")
        rc = libc.pthread_set_qos_class_self_np(_QOS_CLASS_BACKGROUND, 0)
    except (OSError, AttributeError) as exc:
        log.warning("compute priority: background QoS unavailable (%s); normal", exc)
        return "none"
    if rc != 0:
        log.warning("compute priority: background QoS refused (errno %d); normal", rc)
        return "none"
    return "QOS_CLASS_BACKGROUND"


def _lower_windows() -> str:
    try:
        k32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
        ok = k32.SetThreadPriority(k32.GetCurrentThread(), _THREAD_PRIORITY_IDLE)
    except (OSError, AttributeError) as exc:
        log.warning("compute priority: SetThreadPriority unavailable (%s); normal", exc)
        return "none"
    if not ok:
        log.warning("compute priority: THREAD_PRIORITY_IDLE refused; normal")
        return "none"
    return "THREAD_PRIORITY_IDLE"
