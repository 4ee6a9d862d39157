"""The core thread: owns the Coordinator core, fed by a queue, ticked at a fixed rate.

The network thread ``submit``s facts (connected, received, disconnected, admin
calls) to a ``queue.SimpleQueue``; this thread takes them one by one, calls the
core with ``now = time.monotonic()`` and hands the outputs to its sinks in
batches (up to ``MAX_BATCH`` inputs while more are queued, at once when the inbox
is empty), in order. Between inputs it calls ``tick`` at ``tick_hz`` or earlier at
``next_wakeup()``. A slow merge delays other updates, never the network thread.

With a store it restores the newest valid checkpoint on start, writes one when
the core asks and on ``stop`` (runtime/writer.py, on a writer thread), and holds
each ack that promises a result until a write holds it (runtime/ackgate.py); the
job's ``bye`` waits behind them and ``done`` is set once it went out. The theory
and the measurements: docs/operations.md, "Acknowledge after durable".
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from coordinator.core import events as ev
from coordinator.core.assembly import build_core, restore_core
from coordinator.core.checkpoint import RESTORE_TASK_ID_GAP
from coordinator.core.config import JobConfig
from coordinator.core.machine import Coordinator
from coordinator.core.strategies.layer_split import LayerSplit
from coordinator.runtime.ackgate import AckGate, GateState
from coordinator.runtime.history import History
from coordinator.runtime.journal import Journal
from coordinator.runtime.persist import from_checkpoint
from coordinator.runtime.snapshots import MappedModel, Snapshots
from coordinator.runtime.stats import Stats
from coordinator.runtime.stores import open_store
from coordinator.runtime.writer import CheckpointWriter
from nn.data import Dataset
from nn.mapped import MAP_ABOVE_PARAMS
from protocol import messages as m
from storage.layout import Checkpoint
from storage.limits import StoreLimits
from storage.store import CheckpointStore

log = logging.getLogger(__name__)

Sink = Callable[[list[ev.Output]], None]

#: Most inputs handled before the outputs gathered so far go to the sinks.
MAX_BATCH = 64


class ServiceStopped(RuntimeError):
    """The core thread is stopping or stopped: a ``call``, ``act`` or
    ``checkpoint_now`` made then fails with this instead of waiting forever."""


class CoreService:
    """One core on its own thread; see the module docstring. Use ``start``/``stop``
    (or ``with``); ``submit_*`` may be called from any thread."""

    def __init__(
        self,
        job: JobConfig,
        *,
        seed: int = 0,
        dataset: Dataset | None = None,
        store: str | Path | None = None,
        tick_hz: float = 20.0,
        keep_checkpoints: int = 3,
        ack_durable: bool | None = None,
        durable_interval: float = 0.5,
        allow_fresh_start: bool = False,
        mapped: bool | None = None,
        store_limits: StoreLimits | None = None,
    ) -> None:
        """``mapped``: hold the model in a memory-mapped file (None: when it has more
        than ``MAP_ABOVE_PARAMS`` parameters). ``store_limits``: the store's chunk
        size (one neuron group per chunk: the unit an incremental checkpoint
        rewrites) and write budget."""
        if not tick_hz > 0:
            raise ValueError(f"tick_hz: must be > 0, got {tick_hz!r}")
        if not durable_interval > 0:
            raise ValueError(f"durable_interval: must be > 0, got {durable_interval!r}")
        if ack_durable and store is None:
            raise ValueError("ack_durable: needs a store to make results durable in")
        self.job = job
        self.allow_fresh_start = allow_fresh_start
        self._resume: Checkpoint | None = None
        self.stats = Stats()
        self.store: CheckpointStore | None = None
        self._store_path = Path(store) if store is not None else None
        self._store_limits = store_limits
        if mapped is None:
            mapped = job.spec.num_params > MAP_ABOVE_PARAMS
        self._mapped = MappedModel(job.spec, self._store_path) if mapped else None
        #: the log of in-place merges acks wait for instead of checkpoints, when the
        #: job's results are all in-place merges (coordinator/runtime/journal.py)
        self._journal: Journal | None = None
        #: task ids below this are recorded in the store as possibly issued
        self._ids_reserved = 0
        self._keep = keep_checkpoints
        self._seed = seed
        self._dataset = dataset
        self.core: Coordinator | None = None
        self._interval = 1.0 / tick_hz
        # SimpleQueue, not Queue: its put takes no Python-level lock, so the network
        # thread never blocks on (and hands the GIL over to) this thread's get.
        self._inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._sinks: list[Sink] = [self._count]
        #: called on the writer thread with each checkpoint's write time (metrics)
        self.checkpoint_observers: list[Callable[[float], None]] = []
        #: evaluations and throughput over time (GET /api/history), in checkpoints
        self.history = History()
        #: (bytes in, bytes out) of the network driver, for the history (optional)
        self.traffic: Callable[[], tuple[int, int]] | None = None
        self._out: list[ev.Output] = []  # outputs not yet handed to the sinks
        self._thread: threading.Thread | None = None
        #: snapshots and the writer thread that commits them (writer.py), with a store
        self._writer: CheckpointWriter | None = None
        self.done = threading.Event()
        self.stopped = threading.Event()
        # Set (under ``_gate``) once the core thread takes no more requests: a
        # request that carries a future is refused from then on, so none waits
        # on a thread that will never answer it.
        self._closing = False
        self._gate = threading.Lock()
        self.ack_durable = store is not None if ack_durable is None else ack_durable
        self.durable_interval = durable_interval
        #: acks held until durable (ackgate.py); only the core thread touches it
        self.acks = AckGate()
        self._inflight = 0  # snapshots handed to the writer, not yet reported back
        self._written_version = -1  # newest version handed to the writer
        self._last_snapshot = -float("inf")

    # -- lifecycle -----------------------------------------------------------------

    def add_sink(self, sink: Sink) -> None:
        """Call ``sink(outputs)`` on the core thread with each batch of outputs (in order)."""
        self._sinks.append(sink)

    def start(self) -> None:
        """Build (or restore) the core and start its thread; idempotent."""
        if self._thread is not None:
            return
        self.core = core = self._build_core()
        # a clock of its own caps evaluations at eval.max_share of this thread
        core.evaluator.timer = time.perf_counter
        if self._mapped is not None:  # the writer thread may copy it as merges go on
            core.model.lock = threading.Lock()
        if self.store is not None:
            inbox = self._inbox
            self._writer = writer = CheckpointWriter(
                self.store,
                Snapshots(core.spec, self.store.param_groups(core.spec)),
                job=self.job,
                mapped=self._mapped is not None,
                keep=self._keep,
                stats=self.stats,
                history=self.history,
                report=lambda *written: inbox.put(("written", *written)),
                observers=self.checkpoint_observers,
            )
            if self._resume is not None:  # before a replay moves the model on from it
                writer.snapshots.restored(self._resume.version, core.model.changed)
            self._open_journal(core)
            writer.journal = self._journal
            # Past every id an earlier run may have issued, then reserve this run's.
            floor = self.store.task_ids_reserved()
            if core.book.next_task_id < floor:
                core.book.next_task_id = floor
            self._reserve_task_ids(core, wait=True)
            if self._resume is None and self._mapped is not None:
                self._checkpoint(core)  # whole once, from the file, before serving
        self.stats.version = core.version
        self._thread = threading.Thread(target=self._run, name="crowdgrad-core", daemon=True)
        self._thread.start()

    def stop(self, *, timeout: float = 30.0) -> None:
        """Finish the current event, checkpoint, stop the thread; idempotent."""
        if self._thread is None:
            return
        with self._gate:
            self._closing = True
        self._inbox.put(("stop",))
        self._thread.join(timeout)
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self.store is not None:
            self.store.close()
            self.store = None
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        if self._mapped is not None:
            self._mapped.close()

    def __enter__(self) -> CoreService:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- inputs (any thread) -------------------------------------------------------

    def submit_connect(self, client_id: str, hello: m.Hello, address: str | None = None) -> None:
        self._inbox.put(("connect", client_id, hello, address))

    def submit_receive(self, client_id: str, message: m.Message, nbytes: int) -> None:
        self._inbox.put(("receive", client_id, message, nbytes))

    def submit_receives(self, received: list[tuple[str, m.Message, int]]) -> None:
        """``submit_receive`` of each ``(client_id, message, nbytes)``, in order, at once."""
        self._inbox.put(("receives", [("receive", *r) for r in received]))

    def submit_disconnect(self, client_id: str, reason: str) -> None:
        self._inbox.put(("disconnect", client_id, reason))

    def call(self, fn: Callable[[Coordinator], Any]) -> Future[Any]:
        """Run ``fn(core)`` on the core thread (admin commands, inspection)."""
        return self._request(("call", fn))

    def act(self, fn: Callable[[Coordinator, float], tuple[Any, list[ev.Output]]]) -> Future[Any]:
        """Run ``fn(core, now)`` on the core thread, for actions that move the model
        (an edge's rebase): its outputs go out like a result's (model updated,
        checkpoint, evaluation, tasks); the future gives its first value."""
        return self._request(("act", fn))

    def checkpoint_now(self) -> Future[Any]:
        """Snapshot on the core thread and write; the future gives the version written
        (``ServiceStopped`` once stopping: the stop writes its own final checkpoint)."""
        return self._request(("checkpoint",))

    def _request(self, item: tuple[Any, ...]) -> Future[Any]:
        """Queue ``item`` plus a future for the core thread, or fail the future at once
        when the thread takes no more requests (stopping, stopped, crashed)."""
        fut: Future[Any] = Future()
        with self._gate:
            if not self._closing:
                self._inbox.put((*item, fut))
                return fut
        fut.set_exception(ServiceStopped("the coordinator is stopping"))
        return fut

    def set_paused(self, paused: bool) -> None:
        """Paused: frames from clients are held (results go in when it resumes),
        ticks continue, and shard fetches are still answered, so clients that
        join meanwhile get ready to compute."""
        self._inbox.put(("pause", paused))

    # -- the thread ----------------------------------------------------------------

    def _open_journal(self, core: Coordinator) -> None:
        """With a journal: replay the merges logged after the restored checkpoint."""
        if self._store_path is None or not self.ack_durable or not core.merges_in_place:
            return
        self._journal = Journal(self._store_path, core.spec)
        before = core.version
        rows_as_of = None
        resume = self._resume
        if resume is not None and any(v != resume.version for v in resume.as_of):
            assert self.store is not None  # a fuzzy checkpoint: groups of their own versions
            rows_as_of = [np.full(n, resume.version, np.int64) for n, _ in core.spec.layer_shapes]
            for g, v in zip(self.store.param_groups(core.spec), resume.as_of, strict=True):
                rows_as_of[g.layer][g.row_start : g.row_end] = v
        replayed = core.replay(
            self._journal.merges(after_version=core.version), rows_as_of=rows_as_of
        )
        self._journal.replayed = replayed
        self.stats.journal = self._journal.summary()
        if replayed:
            self._journal.durable.update(core.book.accepted_ids())
            log.info("journal: replayed %d merges, v%d -> v%d", replayed, before, core.version)

    def _reserve_task_ids(self, core: Coordinator, *, wait: bool = False) -> None:
        """Keep the store's reserved task ids a gap ahead of the ids issued: at
        start before serving (``wait``), then on the writer thread whenever half of
        the gap is used (a crash in between still leaves the other half)."""
        store, issued = self.store, core.book.next_task_id
        if store is None or issued <= self._ids_reserved - RESTORE_TASK_ID_GAP // 2:
            return
        self._ids_reserved = issued + RESTORE_TASK_ID_GAP
        if wait or self._writer is None:
            store.reserve_task_ids(self._ids_reserved)
            return
        self._writer.reserve_task_ids(self._ids_reserved)

    def _build_core(self) -> Coordinator:
        core = self._make_core()
        if self.store is not None:  # the shards, content-addressed beside the checkpoints
            for s in core.data.shards:
                self.store.put_blob(s.blob)
        return core

    def prepare(self) -> None:
        """Open the store and find the checkpoint to resume from (idempotent; ``start``
        calls it); raises FreshStartRefused as ``open_store`` does."""
        if self._store_path is None or self.store is not None:
            return
        self.store, self._resume = open_store(
            self._store_path,
            limits=self._store_limits,
            into=None if self._mapped is None else self._mapped.blank(),
            allow_fresh_start=self.allow_fresh_start,
        )

    @property
    def resume_version(self) -> int | None:
        """The checkpoint version ``prepare`` found to carry on from (None: a fresh
        start), so a driver can say "resumed from checkpoint N" before it serves."""
        return None if self._resume is None else self._resume.version

    def _make_core(self) -> Coordinator:
        self.prepare()
        ckpt = self._resume
        # Resume tokens are bearer secrets: unguessable, and none a past run issued.
        key = secrets.token_bytes(32)
        if ckpt is None:
            if self._mapped is None:
                return build_core(self.job, seed=self._seed, dataset=self._dataset, session_key=key)
            params = self._mapped.fresh(self.job.model.init_seed)
            return build_core(
                self.job,
                params,
                self._seed,
                dataset=self._dataset,
                share_params=True,
                session_key=key,
            )
        mapped = self._mapped is not None
        core = restore_core(
            self.job,
            from_checkpoint(ckpt, params=not mapped),
            self._seed,
            dataset=self._dataset,
            params=ckpt.params if mapped else None,  # restored into the file
            session_key=key,
        )
        self.stats.restored_from = ckpt.version
        self.history.load(ckpt.metadata.get("history"))
        self._written_version = ckpt.version
        self.acks.committed = frozenset(int(t) for t in ckpt.applied_results if t.isdigit())
        log.info("restored checkpoint v%d from %s", ckpt.version, self._store_path)
        return core

    def _run(self) -> None:
        core = self.core
        assert core is not None
        held: deque[tuple[Any, ...]] = deque()  # client input while paused
        next_tick = time.monotonic()
        batch = 0
        try:
            while True:
                now = time.monotonic()
                if now >= next_tick:
                    self._emit(core.tick(now))
                    wake = core.next_wakeup()
                    next_tick = now + self._interval
                    if wake is not None and wake < next_tick:
                        next_tick = max(wake, now + 1e-3)
                    self.stats.window.append((now, self.stats.accepted))
                    self._sample_history()
                self._maybe_durable(core, now)
                try:
                    item = self._inbox.get_nowait()
                    batch += 1
                except queue.Empty:
                    item = None
                if item is None or batch >= MAX_BATCH:
                    self._flush_out()
                    batch = 0
                if item is None:
                    try:
                        item = self._inbox.get(timeout=max(0.0, next_tick - time.monotonic()))
                    except queue.Empty:
                        continue
                kind = item[0]
                if kind == "stop":
                    break
                if kind == "pause":
                    self.stats.paused = bool(item[1])
                    if not self.stats.paused:
                        self.stats.held_results.clear()
                        while held:
                            self._handle(core, held.popleft())
                    continue
                if kind in ("written", "logged"):  # the writer's and the journal's reports
                    (self._written if kind == "written" else self._logged)(*item[1:])
                    continue
                batch += len(item[1]) - 1 if kind == "receives" else 0  # each one an input
                for one in item[1] if kind == "receives" else (item,):
                    if not self._held(one, held):
                        self._handle(core, one)
        except Exception:  # a bug in the core: log it, stop serving rather than hang
            log.exception("coordinator core crashed; stopping")
        finally:
            with self._gate:  # no request is queued after this: _final_checkpoint fails
                self._closing = True  # those already queued
            self._final_checkpoint(core)
            self._flush_out()
            self.stopped.set()

    def _held(self, item: tuple[Any, ...], held: deque[tuple[Any, ...]]) -> bool:
        """While paused, a client's frame (bar a shard fetch) waits in ``held``."""
        if not self.stats.paused or item[0] != "receive" or isinstance(item[2], m.Fetch):
            return False
        held.append(item)
        if isinstance(item[2], m.Result):
            self.stats.held_results.add(item[1])
        return True

    def _handle(self, core: Coordinator, item: tuple[Any, ...]) -> None:
        now = time.monotonic()
        match item[0]:
            case "connect":
                self._emit(core.connect(item[1], item[2], now, address=item[3]))
            case "receive":
                if item[1] in core.conns:  # closed by the core while the frame queued
                    self._emit(core.receive(item[1], item[2], now, nbytes=item[3]))
            case "disconnect":
                self._emit(core.disconnect(item[1], now, item[2]))
            case "call":
                fn, fut = item[1], item[2]
                try:
                    fut.set_result(fn(core))
                except Exception as exc:
                    fut.set_exception(exc)
            case "act":
                fn, fut = item[1], item[2]
                try:
                    value, outputs = fn(core, now)
                except Exception as exc:
                    fut.set_exception(exc)
                else:
                    self._emit(outputs)
                    fut.set_result(value)
            case "checkpoint":
                item[1].set_result(self._checkpoint(core))
            case other:
                raise AssertionError(f"core service: unknown input {other!r}")

    def _sample_history(self) -> None:
        wall = time.time()
        if not self.history.due(wall):
            return
        st = self.stats
        b_in, b_out = self.traffic() if self.traffic is not None else (0, 0)
        self.history.sample(
            wall, version=st.version, accepted=st.accepted, rejected=st.rejected,
            clients=st.clients, bytes_in=b_in, bytes_out=b_out,
        )  # fmt: skip

    def _emit(self, outputs: list[ev.Output]) -> None:
        if not outputs:
            return
        self.history.observe(outputs, time.time())
        core = self.core
        assert core is not None
        checkpoint = any(isinstance(o, ev.Checkpoint) for o in outputs)
        self._reserve_task_ids(core)
        if self._journal is not None:
            self._journal.observe(outputs)
        if self.ack_durable:
            outputs = self.acks.admit(outputs, durable=self._journaled)
        if self._journal is not None:
            inbox = self._inbox
            self._journal.sealed(self.acks.seq, lambda cover, ok: inbox.put(("logged", cover, ok)))
        if checkpoint:  # after holding: the snapshot is of now, so it covers their acks
            self._checkpoint(core)
        if any(isinstance(o, ev.JobFinished) for o in outputs):
            outputs = self.acks.end(outputs)
            if self.acks.state is GateState.ENDING and not checkpoint:
                # The job just ended with acks still held: its byes and closes wait
                # for them, and one snapshot, taken now, makes them all durable.
                self._checkpoint(core)
        self._release(outputs)

    def _journaled(self, task_id: int) -> bool:
        return self._journal is not None and task_id in self._journal.durable

    def _count(self, outputs: list[ev.Output]) -> None:
        """The first sink: the counters, and what /api/status reads off the core."""
        st, core = self.stats, self.core
        st.count(outputs)
        st.acks_held = len(self.acks)
        if core is None:  # not started
            return
        st.version = core.version
        st.clients = len(core.conns)
        if core.verifier.enabled:
            st.replication = core.verifier.summary()
        if core.upstream is not None:
            st.upstream = core.upstream.summary()
        if isinstance(core.strategy, LayerSplit):
            st.split = core.strategy.summary()
        if self._journal is not None:
            st.journal = self._journal.summary()

    def _flush_out(self) -> None:
        """Hand the gathered outputs to every sink (one call each, in order)."""
        if self._out:
            outputs, self._out = self._out, []
            for sink in self._sinks:
                sink(outputs)

    # -- acknowledge after durable -------------------------------------------------

    def _maybe_durable(self, core: Coordinator, now: float) -> None:
        """Group commit: one snapshot for all acks held, at most every interval
        (with a journal, only while it has a gap: otherwise the log releases them)."""
        if self._journal is not None and self._journal.gap is None:
            return
        if (
            len(self.acks)
            and not self._inflight
            and core.version > self._written_version
            and now >= self._last_snapshot + self.durable_interval
        ):
            self._checkpoint(core)
            self.stats.durable_checkpoints += 1

    def _written(self, cover: int, version: int, outcome: str, tasks: frozenset[int]) -> None:
        """The writer reports on the snapshot that covered held acks up to ``cover``."""
        self._inflight -= 1
        if self._writer is not None:
            self._writer.snapshots.written(version, outcome)
        if outcome in ("failed", "no-base"):  # write it again once the interval has passed
            self._written_version = min(self._written_version, version - 1)
            return
        if outcome == "exists":  # an older copy of this version: wait for the next one
            self._release(self.acks.superseded(cover))
            return
        if self._journal is not None:
            self._journal.committed(version, tasks)
        self._release(self.acks.committed_upto(cover, tasks))

    def _logged(self, cover: int, ok: bool) -> None:
        """The journal reports on the merges of the batch whose acks went up to ``cover``."""
        journal = self._journal
        if journal is None:
            return
        if not ok:
            journal.failed(self.core.version if self.core is not None else 0)
            return
        if journal.gap is not None:
            return  # a checkpoint after the gap releases them
        self._release(self.acks.released_upto(cover))

    def _release(self, outputs: list[ev.Output]) -> None:
        """Queue outputs for the sinks; once the gate has let the job's last frames
        go, they leave before anyone waiting on ``done`` acts."""
        self.stats.acks_held = len(self.acks)
        self._out += outputs
        if self.acks.state is GateState.ENDED:
            self._flush_out()
            self.done.set()

    def _checkpoint(self, core: Coordinator) -> int | None:
        """Snapshot now and write (writer.py); returns the version or None."""
        if self.store is None or self._writer is None:
            return None
        version = self._writer.take(core, cover=self.acks.seq)
        self._inflight += 1
        self._written_version = max(self._written_version, version)
        self._last_snapshot = time.monotonic()
        return version

    def _final_checkpoint(self, core: Coordinator) -> None:
        journal = self._journal
        try:
            if self._mapped is not None and journal is not None and journal.gap is None:
                # The journal holds every merge since the last checkpoint: replaying
                # it on restart is cheaper than writing a mapped model whole now.
                log.info("stop: v%d is in the journal; no final checkpoint", core.version)
            else:
                self._checkpoint(core)
            if self._writer is not None:
                self._writer.drain()
        except Exception:
            log.exception("final checkpoint failed")
        while True:  # acks the final checkpoint made durable still go out
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if item[0] == "written":
                self._written(*item[1:])
            elif isinstance(item[-1], Future):  # a call, act or checkpoint never run
                item[-1].set_exception(ServiceStopped("the coordinator stopped"))
