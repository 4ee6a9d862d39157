"""nn.jitcache: a numba cache compiled with another module's code in it is
dropped when that module changes, which numba's own per-file check misses.
Real numba, real cache files, a fresh interpreter per run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from nn.jitcache import STAMP, keep_in_step

ROOT = Path(__file__).resolve().parents[2]

CALLEE = "from numba import njit\n\n@njit(cache=True)\ndef f(x):\n    return x + {k}\n"
CALLER = textwrap.dedent(
    """
    from pathlib import Path
    from numba import njit
    from nn.jitcache import keep_in_step
    keep_in_step(Path(__file__).parent, depends_on=[Path(__file__).parent.parent / "lib"])
    from lib.callee import f

    @njit(cache=True)
    def g(x):
        return f(x) * 10
    """
)


def _tree(tmp_path: Path, k: int, *, guard: bool) -> Path:
    root = tmp_path / ("guarded" if guard else "plain")
    for pkg in ("lib", "app"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "lib" / "callee.py").write_text(CALLEE.format(k=k))
    # without the check, the same caller shows numba's own behaviour
    caller = CALLER if guard else CALLER.replace("keep_in_step(Path", "# keep_in_step(Path")
    (root / "app" / "caller.py").write_text(caller)
    return root


def _g(root: Path) -> int:
    code = "from app.caller import g; print(g(1))"
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{ROOT}"}
    env.pop("NUMBA_CACHE_DIR", None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip())


def test_numba_alone_keeps_a_stale_caller_and_the_guard_drops_it(tmp_path: Path) -> None:
    for guard, after in ((False, 20), (True, 30)):
        root = _tree(tmp_path, 1, guard=guard)
        assert _g(root) == 20
        (root / "lib" / "callee.py").write_text(CALLEE.format(k=2))
        # numba alone checks caller.py only and runs the stale g; the guard drops it
        assert _g(root) == after
        assert any(p.suffix == ".nbi" for p in (root / "app" / "__pycache__").iterdir())


def test_keep_in_step_drops_only_on_a_change_and_never_raises(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    cache = pkg / "__pycache__"
    cache.mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (cache / "a.f-1.py311.nbi").write_bytes(b"i")
    (cache / "a.f-1.py311.1.nbc").write_bytes(b"c")
    (cache / "a.cpython-311.pyc").write_bytes(b"p")
    assert keep_in_step(pkg)  # no stamp yet: whatever is there is of unknown age
    assert sorted(p.name for p in cache.iterdir()) == ["a.cpython-311.pyc", STAMP]
    (cache / "a.f-1.py311.nbi").write_bytes(b"i")
    assert not keep_in_step(pkg) and (cache / "a.f-1.py311.nbi").exists()
    (pkg / "a.py").write_text("x = 2\n")
    assert keep_in_step(pkg) and not (cache / "a.f-1.py311.nbi").exists()
    assert not keep_in_step(tmp_path / "missing")  # nothing there: no error
