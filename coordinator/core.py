"""The coordinator core: a sans-IO state machine driven by connect/receive/disconnect/tick.

Theory of operation. A driver (the websocket server, the simulator, a test)
owns the sockets and the clock; it feeds the core decoded protocol messages and
the current time, and carries out the actions the core returns: ``Send`` a
frame, ``Close`` a connection, write a ``Checkpoint``. Metric events are mixed
into the same list in the order they happened. The core never reads a clock,
never does IO and draws randomness only from a generator seeded by ``seed``, so
the same seed and the same calls give bitwise the same model.

Call-order contract: ``now`` never decreases across calls. ``connect`` once per
connection, with its already decoded ``hello``; then any number of ``receive``;
then ``disconnect`` (a no-op for a client the core closed itself). Call
``tick(now)`` at least at ``next_wakeup()``: it releases paced frames, expires
leases and heartbeats, and closes sync rounds at their deadline.

Rules that protect the model (docs/coordinator.md):

- one live lease per client, plus at most one queued behind it once the client
  asked to prefetch (decentral-async only); a lease is resolved exactly once
  (leases.py);
- the first valid result for an OPEN task is taken; a duplicate, or a late one
  for a task already taken or dropped, is acknowledged ``accepted=False`` with
  reason ``duplicate`` / ``stale`` and never applied;
- a client whose lease expired, or was cancelled because another copy of its
  task won, is simply given its next task; the client session lets a new task
  supersede the old one (there is no cancel message);
- a client that cannot do a task declines it (``decline``, protocol §3.13): the
  lease ends at once, the strategy reissues or drops the task, and the client
  gets no task for a back-off that doubles with each decline in a row;
- every update passes validation (validation.py) before the strategy sees it;
  a client over ``max_rejections`` refused updates is closed;
- peer misbehaviour becomes an ``error`` frame plus a Close; only the caller's
  own misuse (an unknown client id, time going backwards) raises.
"""

from __future__ import annotations

import heapq
import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compression import CodecError
from compression import get as get_codec
from compression.distill import teacher_targets
from coordinator import events as ev
from coordinator.config import JobConfig
from coordinator.data import DataCatalog, load_job_data
from coordinator.downloads import ModelDistribution
from coordinator.evaluation import Evaluator
from coordinator.leases import Lease, LeaseBook, LeaseState, Task, TaskPlan, TaskState
from coordinator.reference import reference_norms
from coordinator.registry import ClientRecord, Registry
from coordinator.replication import Exclusion, Release, Replicator
from coordinator.strategies import (
    ClientView,
    ModelState,
    Outcome,
    StepReport,
    make_strategy,
    serves_prefetch,
)
from coordinator.validation import Reject, UpdateValidator
from nn.data import Dataset
from nn.modelfile import load_model
from nn.params import Params
from nn.spec import INIT_SCHEME
from protocol import messages as m
from protocol.checksum import crc32
from protocol.chunking import Reassembler
from protocol.errors import CLOSE_NORMAL, ErrorCode, ProtocolError
from protocol.limits import LinkLimits, Pacer, RateMeter, negotiate
from protocol.limits import profile as link_profile
from protocol.outbox import PacedOutbox
from protocol.states import advance_clock

log = logging.getLogger(__name__)

#: Assumed client speed (FLOP/s) before hello or measurement says otherwise.
DEFAULT_FLOPS = 1e9
#: After a ``decline`` the client gets no task for this long, doubled with every
#: decline in a row up to the cap (an accepted result resets it): a client that
#: can do nothing costs a task a minute, not a spin (docs/protocol.md §3.13).
DECLINE_BACKOFF_S = 1.0
DECLINE_BACKOFF_MAX_S = 60.0


#: Task ids skipped on a restore: more than a coordinator issues between two
#: checkpoints (docs/coordinator.md, "Tasks and leases").
RESTORE_TASK_ID_GAP = 1 << 20


@dataclass(slots=True)
class _Conn:
    """Per-connection state: granted limits, outbound queue, uploads in flight."""

    client_id: str
    limits: LinkLimits
    #: frames waiting for the link, released by the granted limits' pacer
    outbox: PacedOutbox[ev.Send]
    meter: RateMeter
    uploads: dict[str, _Upload] = field(default_factory=dict)
    #: the client applies model deltas in the job's delta codec (from hello)
    deltas: bool = False
    #: deltas sent in a row since the last full model (drift bound)
    delta_chain: int = 0
    #: the client builds version 0 from the job's init seed: its hello lists the
    #: portable init scheme (docs/protocol.md §12.3; hello.seeded_init alone means
    #: NumPy's PCG64, which this coordinator's version 0 is not)
    seeded_init: bool = False
    #: the client takes chunks spanning several blocks (from hello)
    spans: bool = False
    #: the client asked for its next task while it computes (a prefetch message)
    prefetch_wanted: bool = False
    #: the client takes its rows as shards named by hash (hello.data, §13)
    data: bool = False
    #: shards named in a task to this connection so far (the first pays its transfer)
    shards_named: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Upload:
    """A result whose chunks are arriving, and the bytes they took so far."""

    result: m.Result
    reasm: Reassembler
    frame_bytes: int = 0
    payload_bytes: int = 0


def _codec_id(name: str) -> int:
    return int(get_codec(name).id)


def _codec_ids(names: tuple[str, ...]) -> set[int]:
    """Wire ids of the codecs a peer named (a parameterised name stands for its
    whole id: the layout does not depend on the parameter); unknown names skip."""
    ids = set()
    for name in names:
        try:
            ids.add(_codec_id(name))
        except CodecError:
            continue
    return ids


def server_limits(job: JobConfig) -> LinkLimits:
    """The job's link profile with its explicit overrides applied."""
    base = link_profile(job.link.profile)
    return LinkLimits(
        bytes_per_s=job.link.bytes_per_s or base.bytes_per_s,
        messages_per_s=job.link.messages_per_s or base.messages_per_s,
        max_message_bytes=job.link.max_message_bytes or base.max_message_bytes,
        burst=base.burst,
    )


class Coordinator:
    """See the module docstring. ``params`` defaults to the spec's seeded init."""

    def __init__(
        self,
        job: JobConfig,
        params: Params | None = None,
        seed: int = 0,
        *,
        dataset: Dataset | None = None,
        teacher: Params | None = None,
    ) -> None:
        spec = job.spec
        # Version 0 is the init seed's exactly when no params were given: then a
        # client that says so in hello builds it itself instead of downloading it.
        seeded = params is None
        if params is None:
            params = spec.init_params(job.model.init_seed)
        if params.spec.widths != spec.widths:
            raise ValueError(
                f"params: widths {list(params.spec.widths)} differ from the job's "
                f"{list(spec.widths)}"
            )
        self.job = job
        #: ``job.spec`` builds a fresh ModelSpec per call; the core asks per task
        self.spec = spec
        self._flops_per_sample = spec.flops_per_sample()
        self.seed = seed
        self.model = ModelState(params=params.copy())
        self._v0_crc = crc32(self.model.params.data) if seeded else None
        root = np.random.SeedSequence(seed)
        # spawn(3)'s first two children are spawn(2)'s: the other streams are unchanged
        strat_seq, codec_seq, replica_seq = root.spawn(3)
        self.strategy = make_strategy(
            model=self.model,
            config=job.strategy,
            data=job.data,
            rng=np.random.default_rng(strat_seq),
        )
        self.codec_rng = np.random.default_rng(codec_seq)
        # Outcomes of resolved tasks are kept long enough to answer a late copy of a
        # result (a client resending after a reconnect) as duplicate, not stale.
        self.book = LeaseBook(
            on_release=self._released, retain_s=max(600.0, 2 * job.lease.resume_grace_s)
        )
        self.registry = Registry(seed, max_left=job.lease.max_resumable)
        self.validator = UpdateValidator(job.validation, size=spec.num_params)
        self.dataset = dataset or load_job_data(job)
        self.data = DataCatalog.for_job(job, self.dataset)
        self._shard_idx = self.data.indices
        #: job data from a file: only clients that fetch shards (hello.data) can train
        self._data_only = job.data.path is not None
        # Task fields that are the same for every task (Task.trusted takes them as is).
        self._dataset_name = f"{self.dataset.name[:100]}#{job.data.seed}"
        st = job.strategy
        self._optimizer = {
            "kind": st.client_optimizer,
            "lr": float(st.lr),
            "momentum": float(st.momentum),
        }
        if teacher is None and job.distill.teacher is not None:
            teacher = load_model(job.distill.teacher)[0]
        #: distillation job: the teacher's logits per training row (float16), else None
        self.teacher_logits = (
            None if teacher is None else teacher_targets(teacher, spec, self.dataset.X_train)
        )
        self.evaluator = Evaluator(self.dataset, job.eval)
        if job.validation.reference_tasks:
            local = self.strategy.task_kind == "local"
            self.validator.reference = reference_norms(
                self.model.params,
                self.dataset,
                self._shard_idx,
                kind="train" if local else "gradient",
                steps=st.tau if local else 1,
                batch=job.data.batch,
                optimizer=self._optimizer,
                seed=seed,
                count=job.validation.reference_tasks,
            )
        self.limits = server_limits(job)
        self.conns: dict[str, _Conn] = {}
        # Bookkeeping that keeps an event O(what changed), not O(clients): join
        # order (dispatch and flush go in it), clients without a live lease, and
        # when each non-empty outbox's head may go (a heap, stale entries skipped).
        self._order: dict[str, int] = {}
        self._joined = 0
        self._idle: set[str] = set()
        self._dirty: set[str] = set()
        self._ready: dict[str, float] = {}
        self._ready_heap: list[tuple[float, int, str]] = []
        #: idle clients that declined a task lately -> when they may get one again
        self._cooling: dict[str, float] = {}
        self.accepted_results = 0
        self.finished: ev.JobFinished | None = None
        self.started_at: float | None = None
        self._now = -math.inf
        self._orphans: dict[int, Task] = {}
        self._update_codec = int(get_codec(job.codecs.update).id)
        #: offer prefetch (welcome.prefetch) and serve it
        self._prefetch = serves_prefetch(job)
        #: how the model reaches clients: seeded init, full (cached per version and
        #: link shape) or a delta (coordinator/downloads.py)
        self.downloads = ModelDistribution(
            spec=spec,
            codecs=job.codecs,
            max_message_bytes=self.limits.max_message_bytes,
            model=lambda: (self.model.version, self.model.params),
            snapshot=lambda v: self.verifier.snapshot(v),
            rng=self.codec_rng,
            delta_rng=np.random.default_rng(codec_seq.spawn(1)[0]),
        )
        #: Answer each heartbeat with an echo. A driver that echoes on its own IO
        #: thread (the websocket server) turns this off: the core then only notes
        #: that the client is alive, which is most of what 10,000 clients send.
        self.echo_heartbeats = True
        self.verifier = Replicator(
            job.replication,
            model=self.model,
            book=self.book,
            registry=self.registry,
            rng=np.random.default_rng(replica_seq),
            describe=self._describe,
            dataset=self.dataset,
            # one result is one additive step: it can be subtracted again
            journal=st.name == "central-async" or st.aggregation == "fedasync",
        )

    # -- public API ----------------------------------------------------------------

    def connect(self, client_id: str, hello: m.Hello, now: float) -> list[ev.Output]:
        """A connection opened and sent ``hello``; answer welcome (or refuse)."""
        out: list[ev.Output] = []
        self._advance(now)
        if client_id in self.conns:
            raise ValueError(f"connect: client {client_id!r} is already connected")
        if self.finished is not None:  # a client that missed the bye learns it now
            return self._finished_bye(client_id)
        try:
            version = m.choose_version(hello.version)
        except ProtocolError as exc:
            return self._refuse(client_id, exc.code, exc.message)
        offered = _codec_ids(hello.codecs)
        missing = [
            c
            for c in (self.job.codecs.model, self.job.codecs.update)
            if _codec_id(c) not in offered
        ]
        if missing:
            return self._refuse(
                client_id, ErrorCode.BAD_FIELD, f"hello.codecs: job needs {sorted(missing)}"
            )
        if self._data_only and not hello.data:
            return self._refuse(
                client_id,
                ErrorCode.BAD_FIELD,
                "hello.data: this job's data comes from the coordinator; the client must "
                "fetch shards by hash (docs/protocol.md §13)",
            )
        if self.verifier.refuses(hello.resume):
            return self._refuse(
                client_id,
                ErrorCode.BAD_FIELD,
                "hello.resume: this session was excluded (a result disagreed with the same "
                "task computed elsewhere)",
            )
        limits = negotiate(hello.limits, self.limits)
        rec, resumed = self.registry.join(
            client_id,
            name=hello.client,
            flops=hello.flops or DEFAULT_FLOPS,
            resume_id=hello.resume,
            now=now,
        )
        conn = _Conn(client_id, limits, PacedOutbox(Pacer(limits)), RateMeter(limits))
        conn.deltas = (
            hello.deltas
            and self.job.codecs.delta is not None
            and _codec_id(self.job.codecs.delta) in offered
        )
        conn.seeded_init = INIT_SCHEME in hello.init_schemes and self._v0_crc is not None
        conn.spans = hello.spans
        conn.data = hello.data
        self.conns[client_id] = conn
        self._order[client_id] = self._joined
        self._joined += 1
        self._idle.add(client_id)
        welcome = m.Welcome(
            version=version,
            session_id=client_id,
            resume_token=rec.resume_id,
            limits=limits,
            heartbeat_interval=self.job.lease.heartbeat_interval_s,
            spans=True,
            prefetch=self._prefetch,
            data=True,
            decline=True,
        )
        self._queue(conn, welcome)
        out.append(ev.ClientJoined(client_id=client_id, name=rec.name, resumed=resumed, now=now))
        self._dispatch(now, out)
        self._flush_all(now, out)
        return out

    def receive(
        self, client_id: str, message: m.Message, now: float, *, nbytes: int | None = None
    ) -> list[ev.Output]:
        """A decoded message from a connected client; ``nbytes`` (its frame size) is
        checked against the granted limits when given."""
        out: list[ev.Output] = []
        self._advance(now)
        conn = self.conns.get(client_id)
        if conn is None:
            raise ValueError(f"receive: client {client_id!r} is not connected")
        rec = self.registry.get(client_id)
        assert rec is not None
        self.registry.touch(rec, now)
        try:
            if nbytes is not None:
                violation = conn.meter.observe(nbytes, now)
                if violation is not None:
                    raise violation
            self._handle(conn, rec, message, now, out, nbytes=nbytes)
        except ProtocolError as exc:
            self._close(conn, exc.code, exc.message, now, out)
        self._dispatch(now, out)
        self._flush_all(now, out)
        return out

    def disconnect(self, client_id: str, now: float, reason: str = "") -> list[ev.Output]:
        """The connection is gone (no-op if the core already closed it)."""
        out: list[ev.Output] = []
        self._advance(now)
        if client_id in self.conns:
            self._drop(client_id, reason or "disconnected", now, out)
            self._dispatch(now, out)
            self._flush_all(now, out)
        return out

    def tick(self, now: float) -> list[ev.Output]:
        """Time passed: heartbeats, lease deadlines, round deadlines, paced frames."""
        out: list[ev.Output] = []
        self._advance(now)
        self.book.forget(now)
        self.registry.forget(now - self.book.retain_s)
        if self.finished is None:
            timeout = self.job.lease.heartbeat_timeout_s
            late: list[str] = []
            for rec in self.registry.least_recently_seen():
                if not now > rec.last_seen + timeout:
                    break
                late.append(rec.client_id)
            for client_id in sorted(late, key=self._order.__getitem__):
                conn = self.conns[client_id]
                self._close(conn, ErrorCode.TIMEOUT, f"no message for {timeout:g} s", now, out)
            for lease in self.book.due(now):
                if not lease.live:  # cancelled since: a lost primary takes its twin
                    continue
                self.book.end(lease, LeaseState.EXPIRED, now)
                expired = self.registry.get(lease.client_id)
                if expired is not None:
                    expired.version_held = None  # it may not have finished the download
                task = self.book.tasks[lease.task_id]
                reissued = self._lease_lost(task, now)
                out.append(
                    ev.LeaseExpired(
                        client_id=lease.client_id,
                        task_id=task.task_id,
                        lease_id=lease.lease_id,
                        reissued=reissued,
                        now=now,
                    )
                )
            grace = self.job.lease.resume_grace_s
            # _orphans is in orphaned_at order (see _lease_lost): stop at the
            # first open task whose grace has not run out.
            orphans = self._orphans
            while orphans:
                tid, task = next(iter(orphans.items()))
                if task.state is not TaskState.OPEN or task.orphaned_at is None:
                    del orphans[tid]  # taken, dropped or leased again since
                elif now >= task.orphaned_at + grace:
                    del orphans[tid]
                    self.book.resolve_task(task, TaskState.DROPPED, now)
                else:
                    break
            report = self.strategy.on_tick(now)
            if report is not None:
                self._stepped(report, now, out)
            limit = self.job.stop.max_time_s
            if limit is not None and self.started_at is not None and now >= self.started_at + limit:
                self._finish("max_time", now, out)
        self._dispatch(now, out)
        self._flush_all(now, out)
        return out

    def next_wakeup(self) -> float | None:
        """The earliest time ``tick`` has something to do (None: only on new input)."""
        times: list[float] = []
        heap, ready = self._ready_heap, self._ready
        while heap and ready.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)  # flushed or gone since
        if heap:
            times.append(heap[0][0])
        if self.finished is None:
            deadline = self.book.next_deadline()
            if deadline is not None:
                times.append(deadline)
            oldest = next(self.registry.least_recently_seen(), None)
            if oldest is not None:
                times.append(oldest.last_seen + self.job.lease.heartbeat_timeout_s + 1e-9)
            deadline = self.strategy.next_deadline()
            if deadline is not None:
                times.append(deadline)
            if self._cooling:
                times.append(min(self._cooling.values()))
            for t in self._orphans.values():  # the first is the oldest (_lease_lost)
                if t.orphaned_at is not None:
                    times.append(t.orphaned_at + self.job.lease.resume_grace_s)
                    break
            if self.job.stop.max_time_s is not None and self.started_at is not None:
                times.append(self.started_at + self.job.stop.max_time_s)
        return min(times) if times else None

    # -- checkpoints ---------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume after a crash: acknowledged results survive
        (those replication holds too)."""
        state = {
            "version": self.model.version,
            "contributions": self.model.contributions,
            "params": self.model.params.data.copy(),
            "strategy": self.strategy.state_dict(),
            "accepted_tasks": sorted(self.book.accepted_ids()),
            "accepted_results": self.accepted_results,
            "next_task_id": self.book.next_task_id,
            "norms": list(self.validator.norms),
        }
        if self.verifier.enabled:
            state["replication"] = self.verifier.state_dict()
        return state

    @classmethod
    def restore(
        cls,
        job: JobConfig,
        state: dict[str, Any],
        seed: int = 0,
        *,
        dataset: Dataset | None = None,
        teacher: Params | None = None,
    ) -> Coordinator:
        """A coordinator resumed from ``state_dict()``; clients reconnect with resume ids
        unknown to it, so they start fresh records, and old task ids are never reused."""
        params = Params.from_flat(job.spec, np.asarray(state["params"], dtype=np.float32))
        core = cls(job, params, seed, dataset=dataset, teacher=teacher)
        core.model.version = int(state["version"])
        core.model.contributions = int(state["contributions"])
        core.strategy.load_state_dict(state["strategy"])
        core.book.remember_accepted(int(t) for t in state["accepted_tasks"])
        core.accepted_results = int(state["accepted_results"])
        # Ids issued after this checkpoint and before the crash are in clients'
        # hands; skip them, so a result resent for one of them is answered stale
        # instead of matching a new task of another version (a counted rejection
        # that closed honest clients after a few crashes).
        core.book.next_task_id = int(state["next_task_id"]) + RESTORE_TASK_ID_GAP
        core.validator.norms.extend(float(x) for x in state["norms"])
        if "replication" in state:
            core.verifier.load_state_dict(state["replication"])
        return core

    # -- message handling ----------------------------------------------------------

    def _handle(
        self,
        conn: _Conn,
        rec: ClientRecord,
        msg: m.Message,
        now: float,
        out: list[ev.Output],
        *,
        nbytes: int | None = None,
    ) -> None:
        match msg:
            case m.Heartbeat():
                if self.echo_heartbeats:
                    self._queue(conn, m.Heartbeat(seq=msg.seq, time=now, echo=msg.time))
            case m.Result():
                self._start_upload(conn, msg, now, out)
                upload = conn.uploads[msg.task_id]
                upload.frame_bytes += nbytes if nbytes is not None else len(m.encode(msg))
            case m.Chunk():
                upload = conn.uploads.get(msg.transfer)
                if upload is None:
                    raise ProtocolError(
                        ErrorCode.UNKNOWN_TASK, f"chunk.transfer {msg.transfer!r}: no result sent"
                    )
                if msg.codec != self._update_codec:
                    raise ProtocolError(
                        ErrorCode.BAD_CHUNK,
                        f"chunk {msg.seq} of {msg.transfer!r}: codec id {msg.codec}, the task "
                        f"asked for {self.job.codecs.update!r} (id {self._update_codec})",
                    )
                upload.reasm.add(msg)
                upload.frame_bytes += nbytes if nbytes is not None else len(m.encode(msg))
                upload.payload_bytes += len(msg.payload)
                if upload.reasm.done:
                    del conn.uploads[msg.transfer]
                    self._on_result(conn, rec, upload, now, out)
            case m.Prefetch():
                self._on_prefetch(conn, msg)
            case m.Fetch():
                self._on_fetch(conn, msg, now, out)
            case m.Decline():
                self._on_decline(conn, rec, msg, now, out)
            case m.Bye():
                out.append(ev.Close(client_id=conn.client_id, code=CLOSE_NORMAL, reason="bye"))
                self._drop(conn.client_id, f"bye: {msg.reason}", now, out)
            case m.Error():
                log.info("client %s reported error %d: %s", conn.client_id, msg.code, msg.message)
            case m.Hello() | m.Welcome() | m.Task() | m.Ack():
                raise ProtocolError(
                    ErrorCode.UNEXPECTED, f"{msg.TYPE}: not expected from a connected client"
                )
            case _:
                raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"{msg.TYPE}: not handled")

    def _on_prefetch(self, conn: _Conn, msg: m.Prefetch) -> None:
        """Queue the client's next task behind the one it names, at the next dispatch.

        Ignored (not an error: the two sides race) unless the job and the strategy
        allow it (``lease.prefetch``, ``Strategy.pipelined``), the named task is
        the client's live lease and nothing is queued behind it yet.
        """
        cid = conn.client_id
        lease = self.book.live_lease_of(cid)
        if (
            self._prefetch
            and lease is not None
            and str(lease.task_id) == msg.task_id
            and self.book.queued_lease_of(cid) is None
        ):
            conn.prefetch_wanted = True
            self._idle.add(cid)
        else:
            log.debug("client %s: prefetch for task %s ignored", cid, msg.task_id)

    def _on_decline(
        self, conn: _Conn, rec: ClientRecord, msg: m.Decline, now: float, out: list[ev.Output]
    ) -> None:
        """End the lease the client will not work on, now rather than at its deadline.

        Ignored (not an error: it races with expiry and with another copy winning)
        unless ``task_id`` is the client's current or queued lease. The strategy may
        lease the task again (a sync round's slot; never back to this client, who is
        in ``task.clients``); otherwise it is dropped and an async strategy revisits
        its shard with a new task. The server then assumes the client holds no model,
        and gives it no task for a back-off that doubles with each decline in a row.
        """
        cid = conn.client_id
        lease = None
        for held in (self.book.live_lease_of(cid), self.book.queued_lease_of(cid)):
            if held is not None and str(held.task_id) == msg.task_id:
                lease = held
        if lease is None:
            log.debug("client %s: decline of task %s ignored", cid, msg.task_id)
            return
        task = self.book.tasks[lease.task_id]
        self.book.end(lease, LeaseState.DECLINED, now)
        rec.version_held = None  # it may have dropped the download
        rec.declined += 1
        rec.declined_in_row += 1
        backoff = DECLINE_BACKOFF_S * 2.0 ** min(rec.declined_in_row - 1, 32)
        self._cooling[cid] = now + min(DECLINE_BACKOFF_MAX_S, backoff)
        reissued = False
        if (
            task.state is TaskState.OPEN
            and not self.book.live_leases(task)
            and not self.verifier.copy_lost(task, now)
        ):
            # No resume grace: its client said it will not deliver.
            reissued = self.strategy.on_lease_lost(task, now)
            if not reissued:
                self._orphans.pop(task.task_id, None)
                self.book.resolve_task(task, TaskState.DROPPED, now)
        log.info("client %s declined task %s: %s", cid, msg.task_id, msg.reason)
        out.append(
            ev.TaskDeclined(
                client_id=cid,
                task_id=task.task_id,
                lease_id=lease.lease_id,
                reason=msg.reason,
                reissued=reissued,
                now=now,
            )
        )

    def _on_fetch(self, conn: _Conn, msg: m.Fetch, now: float, out: list[ev.Output]) -> None:
        """Queue the shard's ``data`` frames behind whatever is queued (§13)."""
        blob = self.data.by_hash.get(msg.data)
        if blob is None:
            raise ProtocolError(ErrorCode.UNKNOWN_TASK, f"fetch.data {msg.data}: no such shard")
        if msg.offset >= len(blob.blob):
            raise ProtocolError(
                ErrorCode.BAD_FIELD,
                f"fetch.offset: expected < {len(blob.blob)} (the shard's size), got {msg.offset}",
            )
        frames = self.data.frames(msg.data, msg.offset, conn.limits.frame_bytes)
        for data, frame in frames:
            conn.outbox.push(
                ev.Send(client_id=conn.client_id, message=data, frame=frame), len(frame)
            )
        self._dirty.add(conn.client_id)
        out.append(
            ev.DataServed(
                client_id=conn.client_id,
                sha256=msg.data,
                nbytes=len(blob.blob) - msg.offset,
                frame_bytes=sum(len(f) for _, f in frames),
                now=now,
            )
        )

    def _start_upload(self, conn: _Conn, msg: m.Result, now: float, out: list[ev.Output]) -> None:
        if msg.num_chunks < 1:
            raise ProtocolError(ErrorCode.BAD_FIELD, "result.num_chunks: an update is required")
        if msg.task_id in conn.uploads:
            raise ProtocolError(ErrorCode.DUPLICATE, f"result {msg.task_id!r}: already uploading")
        reasm = Reassembler.for_params(self.spec, transfer=msg.task_id, total=msg.num_chunks)
        conn.uploads[msg.task_id] = _Upload(msg, reasm)

    def _on_result(
        self,
        conn: _Conn,
        rec: ClientRecord,
        upload: _Upload,
        now: float,
        out: list[ev.Output],
    ) -> None:
        result = upload.result
        update = upload.reasm.params().data
        tid = int(result.task_id) if result.task_id.isdigit() else -1
        task = self.book.tasks.get(tid)
        lease = self._lease_for(task, rec) if task is not None else None
        if task is not None and lease is None:
            # A result counts only from a client that holds (or held, before it resumed)
            # a lease on the task: task ids are sequential, so easy to guess.
            log.info("client %s: result for task %s it was never leased", rec.client_id, tid)
            self._reject(conn, rec, result.task_id, Reject.NOT_LEASED, now, out, count=False)
            return
        if lease is not None and lease.live:
            self.book.end(lease, LeaseState.DONE, now)
        if task is None:  # resolved (its outcome kept a while), forgotten or never issued
            outcome = self.book.outcome(tid)
            if outcome is TaskState.ACCEPTED:
                reason = Reject.DUPLICATE
            elif outcome is TaskState.DROPPED or 0 < tid < self.book.next_task_id:
                reason = Reject.STALE
            else:
                reason = Reject.UNKNOWN_TASK
            self._reject(conn, rec, result.task_id, reason, now, out, count=False)
            return
        if result.model_version != task.version:
            self._reject(conn, rec, result.task_id, Reject.VERSION, now, out, count=True)
            self._maybe_reissue(task, now)
            return
        reject, norm = self.validator.check(update)
        if reject is not None:
            self._reject(conn, rec, result.task_id, reject, now, out, count=True)
            self._maybe_reissue(task, now)
            return
        unit = self.verifier.unit_of(task.task_id)
        if unit is None:
            outcome = self._apply(task, update, norm, rec.resume_id, now, checked=False)
            if not outcome.accepted:
                self._orphans.pop(task.task_id, None)
                self.book.resolve_task(task, TaskState.DROPPED, now)
                reason = Reject(outcome.reason or "stale")
                self._reject(conn, rec, result.task_id, reason, now, out, count=False)
                return
            staleness = outcome.staleness
        else:  # a copy of a replicated task: taken now, in the model once checked
            outcome, staleness = None, self.model.version - task.version
        self._orphans.pop(task.task_id, None)
        self.book.resolve_task(task, TaskState.ACCEPTED, now)
        rec.accepted += 1
        # Refusals fade as results are accepted: a client is closed for a run of
        # bad updates, not for a few spread over a long session.
        rec.rejections = max(0, rec.rejections - 1)
        rec.declined_in_row = 0
        if self.book.live_lease_of(conn.client_id) is None and rec.version_sent == task.version:
            # It holds this task's model, unless a later task (a prefetch) replaced it.
            rec.version_held = task.version
        samples = result.samples or task.steps * task.batch
        rec.observe_speed(self._flops_per_sample * samples, result.compute_seconds)
        self._queue(conn, m.Ack.trusted(task_id=result.task_id, accepted=True))
        out.append(
            ev.ResultAccepted(
                client_id=conn.client_id,
                task_id=task.task_id,
                staleness=staleness,
                version=self.model.version,
                now=now,
                frame_bytes=upload.frame_bytes,
                payload_bytes=upload.payload_bytes,
                replica=self.verifier.is_twin(task.task_id),
            )
        )
        self.verifier.delivered(task)
        if unit is not None:
            self.verifier.arrived(unit, task, rec, update, norm, now)
        elif outcome is not None and outcome.step is not None:
            self._stepped(outcome.step, now, out)

    def _apply(
        self, task: Task, update: np.ndarray, norm: float, holder: str, now: float, *, checked: bool
    ) -> Outcome:
        """Hand a validated update to the strategy, clipped to the median norm now.
        ``checked``: replication compared it; an unchecked one is journaled."""
        scale = self.validator.clip_scale(norm)
        if scale < 1.0:
            update = update * np.float32(scale)
        journal = not checked and self.verifier.journals
        before = self.model.params.data.copy() if journal else None
        outcome = self.strategy.on_result(task, update, now)
        if outcome.accepted:
            self.validator.accept(norm * scale)
            self.accepted_results += 1
            if not checked:
                self.verifier.applied(holder, before, outcome)
        return outcome

    def _verified(self, now: float, out: list[ev.Output]) -> None:
        """Carry out, in order, what replication decided: results that go in now,
        clients excluded, comparisons made (coordinator/replication.py)."""
        ready = self.verifier.ready
        while ready and self.finished is None:
            match item := ready.popleft():
                case Release():  # (too stale by now under max_staleness: not applied)
                    outcome = self._apply(
                        item.task, item.update, item.norm, item.holder, now, checked=item.checked
                    )
                    if outcome.step is not None:
                        self._stepped(outcome.step, now, out)
                case Exclusion():
                    if item.revert is not None:  # its unchecked steps, subtracted again
                        self.model.params.data -= item.revert
                        self.model.version += 1
                        self._stepped(StepReport(stepped=True, merged=0), now, out)
                    out.append(item.event)
                    if item.close and item.event.client_id in self.conns:
                        msg = f"excluded: the result of task {item.event.task_id} disagreed"
                        conn = self.conns[item.event.client_id]
                        self._close(conn, ErrorCode.BAD_FIELD, msg, now, out)
                case _:
                    out.append(item)
        ready.clear()  # the job finished: nothing more goes in

    def _lease_for(self, task: Task, rec: ClientRecord) -> Lease | None:
        """The client's latest lease on ``task``, under this connection or one it
        resumed (leases name the record's resume id, which outlives connections)."""
        for lid in reversed(task.leases):
            lease = self.book.leases[lid]
            if lease.holder == rec.resume_id:
                return lease
        return None

    def _reject(
        self,
        conn: _Conn,
        rec: ClientRecord,
        task_id: str,
        reason: Reject,
        now: float,
        out: list[ev.Output],
        *,
        count: bool,
    ) -> None:
        tid = int(task_id) if task_id.isdigit() else -1
        self._queue(conn, m.Ack.trusted(task_id=task_id, accepted=False, reason=reason.value))
        out.append(
            ev.ResultRejected(client_id=conn.client_id, task_id=tid, reason=reason.value, now=now)
        )
        if count:
            rec.rejections += 1
            if rec.rejections >= self.job.validation.max_rejections:
                self._close(
                    conn,
                    ErrorCode.BAD_FIELD,
                    f"{rec.rejections} updates rejected (limit "
                    f"{self.job.validation.max_rejections})",
                    now,
                    out,
                )

    # -- leases and dispatch -------------------------------------------------------

    def _maybe_reissue(self, task: Task, now: float) -> None:
        if task.state is TaskState.OPEN and not self.book.live_leases(task):
            self._lease_lost(task, now)

    def _lease_lost(self, task: Task, now: float) -> bool:
        """A task lost its lease: ask the strategy whether it is leased again."""
        if task.state is not TaskState.OPEN or self.book.live_leases(task):
            return False
        if self.finished is not None:
            self.book.resolve_task(task, TaskState.DROPPED, now)
            return False
        if self.verifier.copy_lost(task, now):
            return False  # a twin, dropped; or a primary whose twin's result stands for it
        reissue = self.strategy.on_lease_lost(task, now)
        if not reissue:
            task.orphaned_at = now
            # re-insert, so that dict order stays orphaned_at order (now never decreases)
            orphans = self._orphans
            orphans.pop(task.task_id, None)
            orphans[task.task_id] = task
            # Held open while its holder may resume, for at most max_resumable clients
            # (two tasks each: a current and a queued one): past that, and for a holder
            # the registry forgot, the oldest goes as if its grace ran out.
            cap = 2 * self.job.lease.max_resumable
            while orphans:
                oldest = next(iter(orphans.values()))
                if oldest.state is TaskState.OPEN and oldest.orphaned_at is not None:
                    holder = self.book.leases[oldest.leases[-1]].holder
                    if len(orphans) <= cap and self.registry.lookup(holder) is not None:
                        break
                    self.book.resolve_task(oldest, TaskState.DROPPED, now)
                del orphans[oldest.task_id]
        return reissue

    def _dispatch(self, now: float, out: list[ev.Output]) -> None:
        """Give every idle client a task until the strategy says wait (a twin to
        check another client's result first, if one waits: replication.py)."""
        if self.verifier.ready:
            self._verified(now, out)
        if self.finished is not None:
            return
        if self.started_at is None and self.conns:
            self.started_at = now
        if not self._idle:
            return
        for client_id in sorted(self._idle, key=self._order.__getitem__):
            conn = self.conns[client_id]
            busy = self.book.live_lease_of(client_id) is not None
            if busy and not (conn.prefetch_wanted and self.book.queued_lease_of(client_id) is None):
                self._idle.discard(client_id)
                continue
            cooling = self._cooling.get(client_id)
            if cooling is not None:
                if now < cooling:
                    continue  # it declined a task lately; next_wakeup brings it back
                del self._cooling[client_id]
            rec = self.registry.get(conn.client_id)
            assert rec is not None
            view = ClientView(
                client_id=conn.client_id,
                version_held=rec.version_held,
                connected=len(self.conns),
            )
            plan = self.verifier.twin_for(rec.resume_id) or self.strategy.task_for(view, now)
            if plan is None:
                continue  # this client waits; another may still get work (a reissue)
            self._lease(conn, rec, plan, now, out, queued=busy)
            self._idle.discard(client_id)

    def _released(self, client_id: str) -> None:
        """The lease book resolved this client's live lease: it may get work again."""
        if client_id in self.conns:
            self._idle.add(client_id)

    def _lease(
        self,
        conn: _Conn,
        rec: ClientRecord,
        plan: TaskPlan,
        now: float,
        out: list[ev.Output],
        *,
        queued: bool = False,
    ) -> None:
        """Lease a task to the client and queue its frames; ``queued``: behind the
        task it still computes (a prefetch)."""
        conn.prefetch_wanted = False
        if plan.reissue is not None:
            task = self.book.tasks[plan.reissue]
            if task.version != self.model.version:
                raise RuntimeError(f"strategy reissued task {task.task_id} of an old version")
        else:
            v = self.model.version if plan.version is None else plan.version
            task = self.book.new_task(plan, version=v, now=now)
            self.strategy.on_task_created(task)
        replica = self.verifier.leased(task, plan, rec, len(self.conns))
        self._orphans.pop(task.task_id, None)
        # A client that builds version 0 from the init seed gets no model at all.
        seeded = conn.seeded_init and rec.version_held is None and task.version == 0
        dl, conn.delta_chain = self.downloads.plan(
            task_version=task.version,
            held=rec.version_held,
            seeded=seeded,
            wants_deltas=conn.deltas,
            chain=conn.delta_chain,
            limits=conn.limits,
            spans=conn.spans,
        )
        send_model = dl.kind in ("full", "delta")
        model_bytes = dl.nbytes
        shard = self.data.shards[task.shard]
        # The first task naming a shard may wait for its transfer (a cold cache).
        data_bytes = 0
        if conn.data and shard.sha256 not in conn.shards_named:
            conn.shards_named.add(shard.sha256)
            data_bytes = len(shard.blob)
        flops = self._flops_per_sample * task.steps * task.batch
        # A queued task starts when the one in front is done: about one task later.
        compute_s = flops / rec.rate() * (2 if queued else 1)
        predicted = compute_s + (model_bytes + data_bytes + self.spec.nbytes) / min(
            conn.limits.bytes_per_s, 1e12
        )
        lease_s = max(self.job.lease.min_s, self.job.lease.slack * predicted)
        lease = self.book.lease(
            task,
            conn.client_id,
            now=now,
            deadline=now + lease_s,
            queued=queued,
            holder=rec.resume_id,
        )
        # Every field is the core's own, derived from the checked job and its own
        # counters: built without the per-field checks (tests/coordinator/test_core.py
        # holds it equal to the checked construction).
        msg = m.Task.trusted(
            task_id=str(task.task_id),
            kind=self._task_kind(task),
            model_version=dl.version,
            spec=self.spec,
            dataset=self._dataset_name,
            shard=task.shard,
            indices=self._task_indices(conn, task),
            steps=task.steps,
            batch=task.batch,
            optimizer=self._optimizer,
            seed=task.seed,
            deadline=float(lease_s),
            base_version=dl.version if dl.kind == "none" else None,
            model_transfer=dl.transfer if send_model else None,
            num_chunks=len(dl.chunks),
            upload_codec=self.job.codecs.update,
            error_feedback=self.job.codecs.error_feedback,
            delta_base=dl.delta_base,
            init_seed=self.job.model.init_seed if seeded else None,
            init_crc=self._v0_crc if seeded else None,
            data=shard.sha256 if conn.data else None,
            init_scheme=INIT_SCHEME if seeded else None,
            **self._distill_fields(task),
        )
        self._queue(conn, msg)
        for chunk, frame in zip(dl.chunks, dl.frames, strict=True):
            conn.outbox.push(
                ev.Send(client_id=conn.client_id, message=chunk, frame=frame), len(frame)
            )
        rec.version_held = rec.version_sent = dl.version
        out.append(
            ev.TaskLeased(
                client_id=conn.client_id,
                task_id=task.task_id,
                lease_id=lease.lease_id,
                version=dl.version,
                shard=task.shard,
                deadline=lease.deadline,
                now=now,
                download=dl.kind,
                download_bytes=model_bytes,
                queued=queued,
                replica=replica,
            )
        )

    def _task_indices(self, conn: _Conn, task: Task) -> np.ndarray | None:
        """Rows of the task's data: all of its shard for a client that fetches shards
        (explicit only for distill, whose teacher rows align with them), else the
        shard's rows of the named dataset's training split."""
        if not conn.data:
            return self._shard_idx[task.shard]
        if self.teacher_logits is not None:
            return np.arange(self.data.shards[task.shard].rows, dtype=np.int32)
        return None

    def _describe(self, task: Task) -> m.Task:
        """The task as a client without shards gets it, minus the model: what the
        coordinator runs itself to settle a replication dispute (replication.py)."""
        return m.Task.trusted(
            task_id=str(task.task_id),
            kind=self._task_kind(task),
            model_version=task.version,
            spec=self.spec,
            dataset=self._dataset_name,
            shard=task.shard,
            indices=self._shard_idx[task.shard],
            steps=task.steps,
            batch=task.batch,
            optimizer=self._optimizer,
            seed=task.seed,
            base_version=task.version,
            **self._distill_fields(task),
        )

    def _task_kind(self, task: Task) -> str:
        if task.kind == "gradient":
            return "gradient"
        return "train" if self.teacher_logits is None else "distill"

    def _distill_fields(self, task: Task) -> dict[str, Any]:
        """A distill task carries its shard's teacher logits (docs/coordinator.md)."""
        if self._task_kind(task) != "distill":
            return {}
        assert self.teacher_logits is not None
        return {
            "teacher_logits": self.teacher_logits[self._shard_idx[task.shard]],
            "temperature": self.job.distill.temperature,
            "distill_alpha": self.job.distill.alpha,
        }

    # -- model steps, evaluation, stop ---------------------------------------------

    def _stepped(self, report: StepReport, now: float, out: list[ev.Output]) -> None:
        for tid in report.dropped:
            task = self.book.tasks.get(tid)
            if task is not None and task.state is TaskState.OPEN:
                self._orphans.pop(tid, None)
                self.book.resolve_task(task, TaskState.DROPPED, now)
        if not report.stepped:
            return
        v = self.model.version
        out.append(ev.ModelUpdated(version=v, contributions=self.model.contributions, now=now))
        if not self.model.params.is_finite():
            raise RuntimeError(f"model became non-finite at version {v}: a strategy bug")
        every = self.job.checkpoint.every_versions
        if every and v % every == 0:
            out.append(ev.Checkpoint(version=v))
        stop = self.job.stop
        if self.evaluator.due(v):
            e = self.evaluator.run(self.model.params, v, now)
            out.append(e)
            if stop.target_accuracy is not None and e.accuracy >= stop.target_accuracy:
                self._finish("target_accuracy", now, out)
                return
        if stop.max_versions is not None and v >= stop.max_versions:
            self._finish("max_versions", now, out)

    def _finish(self, reason: str, now: float, out: list[ev.Output]) -> None:
        if self.finished is not None:
            return
        v = self.model.version
        last = self.evaluator.last
        if last is None or last.version != v:
            last = self.evaluator.run(self.model.params, v, now)
            out.append(last)
        for task in self.book.open_tasks():
            self.book.resolve_task(task, TaskState.DROPPED, now)
        self._orphans.clear()
        self.finished = ev.JobFinished(version=v, reason=reason, accuracy=last.accuracy, now=now)
        out.append(self.finished)
        if self.job.checkpoint.every_versions:
            out.append(ev.Checkpoint(version=v))
        for conn in list(self.conns.values()):
            self._flush(conn, now, out)
            # Every result taken so far is acknowledged before the bye: acks still
            # held by pacing go now (a few dozen bytes each). Tasks, model chunks
            # and shard data behind them are for tasks just dropped: never sent.
            out.extend(s for s in conn.outbox if isinstance(s.message, m.Ack))
            conn.outbox.clear()
            out.extend(self._finished_bye(conn.client_id))
            self._drop(conn.client_id, reason, now, out)

    # -- connections and pacing ----------------------------------------------------

    def _advance(self, now: float) -> None:
        self._now = advance_clock("coordinator", self._now, now)

    def _finished_bye(self, client_id: str) -> list[ev.Output]:
        """``bye`` with reason ``finished`` (do not reconnect) and why, then close 1000."""
        assert self.finished is not None
        bye = m.Bye(reason=m.BYE_FINISHED, detail=self.finished.reason)
        return [
            ev.Send(client_id=client_id, message=bye, frame=m.encode(bye)),
            ev.Close(client_id=client_id, code=CLOSE_NORMAL, reason=m.BYE_FINISHED),
        ]

    def _refuse(self, client_id: str, code: ErrorCode, message: str) -> list[ev.Output]:
        err = m.Error(code=int(code), message=message)
        ps = ProtocolError(code, message)
        return [
            ev.Send(client_id=client_id, message=err, frame=m.encode(err)),
            ev.Close(client_id=client_id, code=ps.close_code, reason=message[:120]),
        ]

    def _close(
        self, conn: _Conn, code: ErrorCode, message: str, now: float, out: list[ev.Output]
    ) -> None:
        """Close a misbehaving or silent peer: error frame now (unpaced), then Close."""
        if conn.client_id not in self.conns:
            return
        out.extend(self._refuse(conn.client_id, code, message))
        self._drop(conn.client_id, f"closed: {code.name}", now, out)

    def _drop(self, client_id: str, reason: str, now: float, out: list[ev.Output]) -> None:
        self.conns.pop(client_id, None)
        self._order.pop(client_id, None)
        self._idle.discard(client_id)
        self._dirty.discard(client_id)
        self._ready.pop(client_id, None)
        self._cooling.pop(client_id, None)
        self.registry.leave(client_id, now)
        # The queued lease first, so that it is not promoted to current in between.
        for lease in (self.book.queued_lease_of(client_id), self.book.live_lease_of(client_id)):
            if lease is not None:
                self.book.end(lease, LeaseState.LOST, now)
                self._lease_lost(self.book.tasks[lease.task_id], now)
        out.append(ev.ClientLeft(client_id=client_id, reason=reason, now=now))

    def _queue(self, conn: _Conn, msg: m.Message) -> None:
        """Append to the outbox (the only way, bar frames queued right behind one:
        it marks the connection for the next flush)."""
        frame = m.encode(msg)
        conn.outbox.push(ev.Send(client_id=conn.client_id, message=msg, frame=frame), len(frame))
        self._dirty.add(conn.client_id)

    def _flush(self, conn: _Conn, now: float, out: list[ev.Output]) -> None:
        conn.outbox.flush(now, out)  # type: ignore[arg-type]

    def _flush_all(self, now: float, out: list[ev.Output]) -> None:
        """Flush, in join order, the connections with new frames or a head now due."""
        heap, ready = self._ready_heap, self._ready
        todo = self._dirty
        while heap and heap[0][0] <= now:
            t, _, client_id = heapq.heappop(heap)
            if ready.get(client_id) == t:
                todo.add(client_id)
        if not todo:
            return
        self._dirty = set()
        for client_id in sorted(todo, key=self._order.__getitem__):
            conn = self.conns[client_id]
            self._flush(conn, now, out)
            t = conn.outbox.next_send_time(max(now, 0.0))
            if t is not None:
                ready[client_id] = t
                heapq.heappush(heap, (t, self._order[client_id], client_id))
            else:
                ready.pop(client_id, None)

    # -- introspection (tests, dashboard) ------------------------------------------

    @property
    def version(self) -> int:
        return self.model.version

    @property
    def params(self) -> Params:
        return self.model.params

    def clients(self) -> list[ClientRecord]:
        return self.registry.connected()
