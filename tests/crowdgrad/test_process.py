"""Process-wide tuning: run in a subprocess, since it changes the interpreter's GC."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from crowdgrad.process import (
    GC_GROWTH,
    GC_GROWTH_SLACK,
    OPENBLAS_THREADS_VAR,
    collector_paused,
    full_collection_due,
    openblas_threads,
    tune_gc,
)


def test_tune_gc_freezes_survivors_and_still_collects_cycles_in_full_collections() -> None:
    code = textwrap.dedent(
        """
        import gc, time, weakref
        from crowdgrad.process import tune_gc

        class Node:
            pass

        thread = tune_gc(freeze_every=0.05, full_every=2.0)
        assert tune_gc() is thread  # idempotent
        assert gc.get_threshold()[0] == 10_000
        frozen = gc.get_freeze_count()
        keep = [[i] for i in range(5000)]  # survivors: frozen within a tick or two
        a, b = Node(), Node()
        a.other, b.other = b, a  # a reference cycle, then garbage
        dead = weakref.ref(a)
        deadline = time.monotonic() + 10  # wait for the freeze, not for a duration
        while gc.get_freeze_count() < frozen + 5000 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gc.get_freeze_count() >= frozen + 5000, (frozen, gc.get_freeze_count())
        del a, b
        gc.collect(0)
        gc.collect(1)
        assert dead() is not None  # frozen: young collections do not see it
        deadline = time.monotonic() + 10
        while dead() is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert dead() is None, "the full collection did not free the cycle"
        print(len(keep))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "5000"


def test_full_collection_comes_early_once_the_heap_doubled() -> None:
    kept = 1_000_000
    bound = int(kept * (1 + GC_GROWTH) + GC_GROWTH_SLACK)
    assert not full_collection_due(bound, kept, since_full=1.0, full_every=600.0)
    assert full_collection_due(bound + 1, kept, since_full=1.0, full_every=600.0)
    assert full_collection_due(kept, kept, since_full=600.0, full_every=600.0)


def test_tune_gc_never_walks_the_frozen_list() -> None:
    """gc.get_freeze_count walks every frozen object with the GIL held: a tenth of
    a core at 10,000 clients when the thread asked it every second."""
    code = textwrap.dedent(
        """
        import gc, time
        from crowdgrad.process import tune_gc

        calls = {"count": 0, "freeze": 0}
        count, freeze = gc.get_freeze_count, gc.freeze

        def counted_count():
            calls["count"] += 1
            return count()

        def counted_freeze():
            calls["freeze"] += 1
            freeze()

        gc.get_freeze_count, gc.freeze = counted_count, counted_freeze
        tune_gc(freeze_every=0.01, full_every=0.05)  # full collections too
        deadline = time.monotonic() + 10  # wait for the loop, not for a duration
        while calls["freeze"] < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert calls["freeze"] >= 20, calls
        assert calls["count"] == 0, calls
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(("freeze", "full"), [(0.0, 1.0), (2.0, 1.0), (-1.0, 5.0)])
def test_tune_gc_refuses_bad_intervals(freeze: float, full: float) -> None:
    with pytest.raises(ValueError, match="freeze_every"):
        tune_gc(freeze_every=freeze, full_every=full)


def test_collector_paused_restores_the_collector_as_it_was() -> None:
    import gc

    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the caller had it off: it stays off
    finally:
        gc.enable()
    with pytest.raises(KeyError), collector_paused():
        raise KeyError("on an error too")
    assert gc.isenabled()


def test_openblas_threads_sets_the_variable_for_the_start_only(monkeypatch) -> None:
    import os

    monkeypatch.delenv(OPENBLAS_THREADS_VAR, raising=False)
    with openblas_threads(3):
        assert os.environ[OPENBLAS_THREADS_VAR] == "3"
    assert OPENBLAS_THREADS_VAR not in os.environ  # child processes see the user's
    monkeypatch.setenv(OPENBLAS_THREADS_VAR, "4")
    with openblas_threads(1):
        assert os.environ[OPENBLAS_THREADS_VAR] == "4"  # the user's choice stands
    assert os.environ[OPENBLAS_THREADS_VAR] == "4"


def test_the_cli_loads_openblas_with_the_thread_count_it_asked_for() -> None:
    """numpy's and scipy's OpenBLAS load inside the CLI's start-up, so they start one
    thread, not one per core (each new worker spins ~0.1 s of CPU before it sleeps)."""
    code = textwrap.dedent(
        """
        import contextlib, sys
        import crowdgrad.process as p

        real, seen = p.openblas_threads, []

        @contextlib.contextmanager
        def spy(n):
            with real(n):
                yield
            if "numpy" in sys.modules and not seen:  # the first start-up scope: the imports
                from threadpoolctl import threadpool_info

                seen.append(sorted(i["num_threads"] for i in threadpool_info()
                                   if i["internal_api"] == "openblas"))

        p.openblas_threads = spy
        from crowdgrad.cli import main

        main(["client", "ws://127.0.0.1:9/ws", "-q", "--max-attempts", "0"])
        print(seen)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != OPENBLAS_THREADS_VAR}
    env.pop("CROWDGRAD_THREADS", None)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[[1, 1]]", out.stdout  # numpy's and scipy's, one thread each
