"""Process-wide tuning: run in a subprocess, since it changes the interpreter's GC."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from crowdgrad.process import tune_gc


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


@pytest.mark.parametrize(("freeze", "full"), [(0.0, 1.0), (2.0, 1.0), (-1.0, 5.0)])
def test_tune_gc_refuses_bad_intervals(freeze: float, full: float) -> None:
    with pytest.raises(ValueError, match="freeze_every"):
        tune_gc(freeze_every=freeze, full_every=full)
