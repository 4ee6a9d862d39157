"""Where ``crowdgrad coordinator`` keeps its run, and what it checks before opening it.

Without ``--store`` the run lives in ``./<job name>.crowdgrad.db`` (unsafe
characters become ``_``), so the same command started again in the same folder
resumes; ``--no-store`` keeps nothing. Before the store is opened for writing, for
a default and a named store alike: one coordinator a store (a ``.lock`` file held
with ``flock`` for the process's life; none where ``fcntl`` does not exist), and
the same model (a store holding another model is refused with what to do). The
store's own rules (restore, quarantine, fresh start) are the service's, unchanged.
Details: docs/operations.md, "Where a run is kept".
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
from pathlib import Path
from typing import IO

from coordinator.core.config import JobConfig
from crowdgrad.cli import UsageError

#: The default store's name is ``<job name>`` plus this, in the working directory.
SUFFIX = ".crowdgrad.db"


def default_store(job_name: str, folder: Path | None = None) -> Path:
    """``<folder>/<job name>.crowdgrad.db`` (folder: the working directory), the name
    made safe for any file system."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", job_name).strip(".") or "job"
    return (folder or Path.cwd()) / f"{safe[:100]}{SUFFIX}"


def chosen_store(args: argparse.Namespace, job: JobConfig) -> tuple[Path | None, bool]:
    """The store this run uses (None: ``--no-store``) and whether it is the default."""
    if args.no_store:
        return None, False
    if args.store is not None:
        return Path(args.store), False
    return default_store(job.name), True


def describe(path: Path, *, default: bool) -> str:
    """How the banner names the store."""
    if default:
        return f"{path} (the default, named after the job; --no-store keeps nothing)"
    return str(path)


class StoreLock:
    """The ``flock`` on ``<store>.lock``, held until ``release`` or the process ends."""

    def __init__(self, store: Path) -> None:
        self.store = store
        self.path = Path(f"{store}.lock")
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        """Take the lock, or raise UsageError naming the process that holds it."""
        try:
            import fcntl
        except ImportError:  # Windows: no flock; the store is unguarded there
            return
        f = open(self.path, "a+")  # noqa: SIM115 (held open for the lock's life)
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise UsageError(
                f"--store: {self.store} is in use by another coordinator "
                f"({holder}); one store serves one coordinator: stop that one, or give "
                "this one --store FILE (or --no-store)"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}\n")
        f.flush()
        self._file = f

    def release(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()  # closing the descriptor drops the flock
            self._file = None


def check_same_model(path: Path, job: JobConfig, *, default: bool) -> None:
    """Refuse a store whose checkpoints hold another model than the job's (read
    only, from the manifests; damaged manifests are the restore's business)."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    from storage.errors import StorageError
    from storage.store import CheckpointStore

    try:
        with CheckpointStore.open(path, readonly=True) as store:
            infos = [i for i in store.list() if i.widths and not i.quarantined]
    except StorageError:
        return  # not a store the checks can read: the service says what is wrong
    if not infos:
        return
    newest = infos[-1]
    want = tuple(job.spec.widths)
    if newest.widths == want:
        return
    how = (
        f"it is the default store of every run named {job.name!r}: give this job a name "
        'of its own (name = "..." at the top of its job file), or --store FILE, or --no-store'
        if default
        else "give this job another --store FILE, or --no-store"
    )
    raise UsageError(
        f"--store: {path} holds a run of model {list(newest.widths)} (checkpoint "
        f"v{newest.version}), not this job's {list(want)}; {how}"
    )
