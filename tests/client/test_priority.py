"""Idle priority for the desktop client's compute thread (client/priority.py)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from client import priority as prio

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux scheduling")


def _in_thread(fn: Callable[[], object]) -> dict[str, Any]:
    """What ``fn`` returned in a fresh thread, with that thread's id, policy, nice."""
    out: dict[str, Any] = {}

    def run() -> None:
        out["tid"] = threading.get_native_id()
        out["value"] = fn()
        out["policy"] = os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else None
        out["nice"] = os.getpriority(os.PRIO_PROCESS, out["tid"])

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out


@linux
def test_idle_lowers_only_the_calling_thread() -> None:
    before = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
    got = _in_thread(lambda: prio.apply(prio.Priority.IDLE))
    assert got["value"] in ("SCHED_IDLE", f"nice {prio.LOWEST_NICE}")
    if got["value"] == "SCHED_IDLE":
        assert got["policy"] == os.SCHED_IDLE
    else:
        assert got["nice"] == prio.LOWEST_NICE
    assert (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)) == before


@linux
def test_threads_started_by_an_idle_thread_inherit_it() -> None:
    """What numba's pool does when the compute thread starts it: it inherits."""

    def lower_then_spawn() -> object:
        prio.lower_this_thread()
        return _in_thread(lambda: None)["policy"]

    got = _in_thread(lower_then_spawn)
    if got["policy"] == os.SCHED_IDLE:
        assert got["value"] == os.SCHED_IDLE


@linux
def test_normal_changes_nothing() -> None:
    got = _in_thread(lambda: prio.apply(prio.Priority.NORMAL))
    assert got["value"] == "none"
    assert got["policy"] == os.sched_getscheduler(0)


@linux
def test_native_pools_spare_python_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only threads the threading module does not know (BLAS, numba) are lowered
    (recorded here, not applied: this process's pools serve other tests)."""
    seen: list[int] = []
    monkeypatch.setattr(prio, "_lower_linux", lambda tid, quiet=False: seen.append(tid) or "x")
    lowered = prio.lower_native_pools()
    assert lowered == seen
    known = {t.native_id for t in threading.enumerate()}
    assert not known & set(lowered) and os.getpid() not in lowered


def test_refusals_fall_back_and_never_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    """SCHED_IDLE refused: nice 19; both refused: normal, with a warning."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the Linux fallbacks")

    def refuse(*_: object) -> None:
        raise PermissionError("not here")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    nice = _in_thread(prio.lower_this_thread)
    assert nice["value"] == f"nice {prio.LOWEST_NICE}"
    monkeypatch.setattr(os, "setpriority", refuse)
    assert _in_thread(prio.lower_this_thread)["value"] == "none"
