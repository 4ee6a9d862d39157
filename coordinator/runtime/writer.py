"""Checkpoints written off the core thread: snapshot here, commit on a writer thread.

``CheckpointWriter.take`` snapshots the core on the core thread (only the neuron
groups that changed since the last commit, runtime/snapshots.py) and commits it
on one writer thread, in version order, then truncates the journal and prunes old
checkpoints. Each write reports ``(cover, version, outcome, tasks)`` through
``report``, outcome one of ``ok``, ``exists`` (that version is stored already),
``no-base`` or ``failed``: the core thread releases held acks on ``ok`` only. A
whole mapped model is written on the core thread from its file, or, when the
journal can redo what merges on meanwhile, copied group by group while it trains.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from coordinator.core.config import JobConfig
from coordinator.core.machine import Coordinator
from coordinator.runtime.history import History
from coordinator.runtime.journal import Journal
from coordinator.runtime.persist import to_checkpoint
from coordinator.runtime.snapshots import Snapshots
from coordinator.runtime.stats import Stats
from nn.params import Params
from storage.errors import CheckpointExists, NoCheckpoint, StorageError
from storage.layout import LiveParams, ParamsPatch
from storage.retention import RetentionPolicy
from storage.store import CheckpointStore

log = logging.getLogger(__name__)

#: ``report(cover, version, outcome, tasks)``: called on the writer thread
Report = Callable[[int, int, str, frozenset[int]], None]


class CheckpointWriter:
    """One store's writer thread and the snapshots it writes; see the module docstring."""

    def __init__(
        self,
        store: CheckpointStore,
        snapshots: Snapshots,
        *,
        job: JobConfig,
        mapped: bool,
        keep: int,
        stats: Stats,
        history: History,
        report: Report,
        observers: list[Callable[[float], None]],
    ) -> None:
        self.store = store
        self.snapshots = snapshots
        self.job = job
        self.mapped = mapped
        self.keep = keep
        self.stats = stats
        self.history = history
        self.report = report
        #: called on the writer thread with each checkpoint's write time (metrics)
        self.observers = observers
        #: the log of in-place merges, when the job has one (set once it is open)
        self.journal: Journal | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="crowdgrad-ckpt")
        self._pending: list[Future[Any]] = []

    def take(self, core: Coordinator, cover: int) -> int:
        """Snapshot now and write; returns the version. ``cover``: the newest held
        ack the snapshot makes durable once it is committed."""
        journal = self.journal
        patch, inline = self.snapshots.take(
            core.version, core.params, core.model.changed, mapped=self.mapped
        )
        state = core.state_dict(params=patch is None and not inline)
        params: Params | ParamsPatch | LiveParams | None = patch
        if inline and journal is not None and journal.gap is None:
            # Fuzzy: copied group by group on the writer thread while merges go on;
            # the journal redoes on each group what came after its copy.
            params, inline = _live(core, patch), False
        elif inline and patch is None:
            params = core.params
        ckpt = to_checkpoint(
            self.job, state, created_at=time.time(), history=self.history.to_json(), params=params
        )
        tasks = frozenset(int(t) for t in state["accepted_tasks"])

        def write() -> None:
            outcome = "failed"
            t0 = time.monotonic()
            try:
                info = self.store.save(ckpt)
                outcome = "ok"
                took = time.monotonic() - t0
                st = self.stats
                st.last_checkpoint_s, st.last_checkpoint_bytes = took, info.nbytes
                st.last_checkpoint_base = info.base
                st.checkpoints += 1
                st.last_checkpoint = ckpt.version
                for observe in self.observers:
                    observe(took)
            except CheckpointExists:  # same version again (e.g. every-N, then stop)
                outcome = "exists"
                return
            except NoCheckpoint:  # the patch's base was deleted meanwhile
                log.exception("checkpoint v%d: write failed; acks stay held", ckpt.version)
                outcome = "no-base"
                return
            except Exception:  # a future nobody waits on would swallow it: log here
                log.exception("checkpoint v%d: write failed; acks stay held", ckpt.version)
                return
            finally:
                self.report(cover, ckpt.version, outcome, tasks)
            if journal is not None:
                try:
                    journal.truncate(ckpt.version)
                except StorageError:
                    log.exception("checkpoint v%d: journal truncate failed", ckpt.version)
            if self.keep:
                try:
                    self.store.prune(RetentionPolicy(keep_last=self.keep))
                except StorageError:
                    log.exception("checkpoint v%d: prune failed", ckpt.version)

        self._pending = [f for f in self._pending if not f.done()]
        if inline:  # after the writes before it: the store commits versions in order
            self.drain()
            write()
        else:
            self._pending.append(self._pool.submit(write))
        return ckpt.version

    def reserve_task_ids(self, upto: int) -> None:
        """Record in the store, on the writer thread, that ids below ``upto`` may
        have been issued."""
        fut = self._pool.submit(self.store.reserve_task_ids, upto)
        fut.add_done_callback(
            lambda f: f.exception() and log.error("reserving task ids: %s", f.exception())
        )

    def drain(self) -> None:
        """Wait for every write handed over so far (raises what one raised)."""
        for f in self._pending:
            f.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _live(core: Coordinator, patch: ParamsPatch | None) -> LiveParams:
    model, whole = core.model, core.model.whole_steps

    def guard() -> None:  # under the model's lock, before each group's copy
        if model.whole_steps != whole:
            raise StorageError("a step the journal cannot redo came during the save")

    return LiveParams(
        params=model.params,
        lock=model.lock,
        version=lambda: model.version,
        base=None if patch is None else patch.base,
        groups=None if patch is None else frozenset(patch.groups),
        guard=guard,
    )
