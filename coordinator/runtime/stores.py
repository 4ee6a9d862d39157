"""Opening a run's store: the newest checkpoint that verifies, or a refusal.

A store with checkpoints none of which verifies is never silently started over:
starting from version 0 would drop every acknowledged result. Only an explicit
``allow_fresh_start`` does, and then the damaged checkpoints are first copied
beside the store (``<store>.damaged-<time>``) for inspection.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from nn.params import Params
from storage.errors import NoCheckpoint, StorageError
from storage.layout import Checkpoint
from storage.limits import StoreLimits
from storage.store import CheckpointStore

log = logging.getLogger(__name__)


class FreshStartRefused(RuntimeError):
    """The store holds checkpoints and none of them verifies (see ``open_store``)."""


def open_store(
    path: Path,
    *,
    limits: StoreLimits | None = None,
    into: Params | None = None,
    allow_fresh_start: bool = False,
) -> tuple[CheckpointStore, Checkpoint | None]:
    """The store at ``path`` and its newest valid checkpoint (None: none yet, or a
    fresh start allowed over damaged ones). ``into``: where a mapped model's
    parameters are restored. Raises FreshStartRefused when checkpoints exist and
    none verifies, unless ``allow_fresh_start``."""
    store = CheckpointStore.open(path, limits=limits)
    try:
        return store, store.load_latest(into=into)
    except NoCheckpoint:
        pass
    damaged = [r.version for r in store.backend.records()]
    if damaged and not allow_fresh_start:
        store.close()
        raise FreshStartRefused(
            f"store {path}: {len(damaged)} checkpoint(s) "
            f"(versions {damaged[0]}..{damaged[-1]}) and none verifies; starting "
            "from version 0 would lose every acknowledged result. Inspect it with "
            "'crowdgrad checkpoint verify', or pass --allow-fresh-start."
        )
    if damaged:
        kept = keep_damaged(store, path)
        log.warning(
            "store %s: no checkpoint verifies; starting from version 0 as allowed; "
            "the damaged checkpoints (versions %d..%d) are kept in %s",
            path, damaged[0], damaged[-1], kept,
        )  # fmt: skip
    return store, None


def keep_damaged(store: CheckpointStore, path: Path) -> Path:
    """Copy a store none of whose checkpoints verifies beside it, before a fresh
    start writes over them: the fresh run's checkpoints take their version
    numbers (a quarantined number is free again), and the operator may still
    want to inspect or salvage them (``crowdgrad checkpoint verify --store``)."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for n in range(1000):
        suffix = f".damaged-{stamp}" + (f"-{n}" if n else "")
        kept = path.with_name(path.name + suffix)
        if not kept.exists():
            break
    backup = getattr(store.backend, "backup", None)
    if backup is None:
        raise StorageError(f"store {path}: cannot copy its damaged checkpoints")
    backup(kept)
    return kept
