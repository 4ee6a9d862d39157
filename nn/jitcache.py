"""numba's on-disk cache, kept in step with the sources it was compiled from.

Why: numba checks a cached function against the file that defines it, and
nothing else. A kernel in ``nn/kernels.py`` compiles ``nn/blas.py``'s ``gemm``
into itself, and ``compression/distill.py`` compiles ``nn.kernels.backward``,
so an edit to the callee alone leaves the caller's cache "valid": it runs the
old code, and a changed signature is not even noticed (a test run passed that
way, while a fresh clone failed to compile). So each package with cached
kernels records a hash of its sources and of those it compiles in; when the
hash changes, its cache files go, and numba compiles afresh.

A fresh clone or a reinstall (new files, new times) never needed this; an
edited checkout does. Caches under ``NUMBA_CACHE_DIR`` are the user's to manage.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

STAMP = "numba-sources.sha256"
SUFFIXES = (".nbi", ".nbc")


def sources_hash(dirs: Iterable[Path]) -> str:
    """SHA-256 over every ``*.py`` file directly in ``dirs``: names and bytes."""
    h = hashlib.sha256()
    for d in dirs:
        for path in sorted(d.glob("*.py")):
            h.update(f"{d.name}/{path.name}\0".encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def keep_in_step(package: Path, *, depends_on: Iterable[Path] = ()) -> bool:
    """Drop ``package``'s numba cache files when its sources, or those of the
    packages it compiles in (``depends_on``), changed since they were written.
    Returns whether it dropped them. Never raises: a read-only install or a
    concurrent start only means numba's own checks apply."""
    cache = package / "__pycache__"
    try:
        digest = sources_hash([package, *depends_on])
        stamp = cache / STAMP
        if stamp.is_file() and stamp.read_text().strip() == digest:
            return False
        stale = [p for p in cache.glob("*") if p.suffix in SUFFIXES] if cache.is_dir() else []
        for p in stale:
            p.unlink(missing_ok=True)
        if stale:
            log.info("%s: sources changed, dropped %d numba cache files", package.name, len(stale))
        cache.mkdir(exist_ok=True)
        stamp.write_text(digest + "\n")
        return bool(stale)
    except OSError as exc:
        log.debug("%s: numba cache left to numba (%s)", package.name, exc)
        return False
