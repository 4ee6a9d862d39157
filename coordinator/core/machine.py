"""The coordinator core: a sans-IO state machine driven by connect/receive/disconnect/tick.

A driver (the websocket server, the simulator, a test) owns the sockets and the
clock; it feeds the core decoded messages and the time, with ``now`` never
decreasing, and carries out the actions returned (``Send``, ``Close``,
``Checkpoint``), metric events mixed in in the order they happened. ``connect``
once per connection with its decoded ``hello``, then ``receive`` any number of
times, then ``disconnect`` (a no-op for a client the core closed); ``tick(now)``
at least at ``next_wakeup()``. No clock, no IO, randomness only from ``seed``:
the same calls give bitwise the same model. Peer misbehaviour becomes an
``error`` frame and a Close; only the caller's own misuse raises. Each concern
has its own module: docs/coordinator.md ("Where each concern lives", "Rules that
protect the model").
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coordinator.core import checkpoint
from coordinator.core import events as ev
from coordinator.core.config import JobConfig
from coordinator.core.connections import Conn, Connections, ConnState, finished_bye, refusal
from coordinator.core.credit import CreditBook
from coordinator.core.data import DataCatalog
from coordinator.core.downloads import ModelDistribution
from coordinator.core.earlystop import EarlyStop, ends_again
from coordinator.core.evaluation import Evaluator
from coordinator.core.handshake import check_hello, open_conn, welcome
from coordinator.core.issuing import TaskIssuer
from coordinator.core.layersplit import LOWER, SplitBlocks
from coordinator.core.leases import LeaseBook, LeaseState, TaskState
from coordinator.core.orphans import Orphans
from coordinator.core.reference import job_reference_norms
from coordinator.core.refusals import RefusalMarks
from coordinator.core.registry import ClientRecord, Registry
from coordinator.core.replication import Replicator
from coordinator.core.results import FollowUp, ResultPath
from coordinator.core.strategies import ModelState, StepReport, Strategy
from coordinator.core.submodel import SubmodelPlanner
from coordinator.core.taskwriter import TaskWriter
from coordinator.core.upstream import UpstreamState
from coordinator.core.validation import Reject, UpdateValidator
from nn.data import Dataset
from nn.params import Params
from nn.spec import ModelSpec
from nn.subnet import Subnet
from protocol import messages as m
from protocol.errors import CLOSE_NORMAL, ErrorCode, ProtocolError
from protocol.limits import LinkLimits, negotiate
from protocol.states import advance_clock
from protocol.volunteer import check_key, check_name

log = logging.getLogger(__name__)

#: models up to this many parameters are checked finite after every version
FINITE_CHECK_EVERY_VERSION_MAX = 1 << 24

#: Assumed client speed (FLOP/s) before hello or measurement says otherwise.
DEFAULT_FLOPS = 1e9


@dataclass(eq=False)
class Coordinator:
    """See the module docstring; built by ``assembly.build_core`` from a job."""

    job: JobConfig
    #: ``job.spec`` builds a fresh ModelSpec per call; the core asks per task
    spec: ModelSpec
    seed: int
    model: ModelState
    #: version 0's CRC when it is the init seed's (clients may build it themselves)
    v0_crc: int | None
    codec_rng: np.random.Generator
    #: each sub-model task's subnet (submodel.py); None: whole-model tasks
    submodels: SubmodelPlanner | None
    #: open connections, their phases and outboxes (connections.py)
    connections: Connections
    book: LeaseBook
    registry: Registry
    validator: UpdateValidator
    dataset: Dataset
    data: DataCatalog
    #: a layer-split job's blocks (layersplit.py); None: whole-model tasks
    split: SplitBlocks | None
    #: the norm check per block of a layer-split job (their updates differ in size)
    block_validators: dict[int, UpdateValidator]
    strategy: Strategy
    #: what a task message says (taskwriter.py)
    tasks: TaskWriter
    evaluator: Evaluator
    limits: LinkLimits
    #: how the model reaches clients: seeded init, full or a delta (downloads.py)
    downloads: ModelDistribution
    verifier: Replicator
    #: tasks that lost their lease: reissued, held for a resuming client, dropped
    orphans: Orphans
    #: closes for refused updates by address and resume id (refusals.py)
    refusal_marks: RefusalMarks
    #: a client's answers to its tasks: results and declines (results.py)
    results: ResultPath
    #: giving a client a task: sized, its download, its lease (issuing.py)
    issuer: TaskIssuer
    #: each volunteer's credit for accepted work (credit.py)
    credit: CreditBook
    flops_per_sample: float
    #: the stream the norm check's sub-model reference tasks are drawn from
    reference_seq: np.random.SeedSequence
    #: the job and its strategy serve prefetch (to the connections offers_prefetch picks)
    prefetch: bool
    finished: ev.JobFinished | None = None
    #: why the run this core was restored from ended (earlystop.ending), if it did
    ended: dict[str, Any] | None = None
    started_at: float | None = None
    #: Answer each heartbeat with an echo. A driver that echoes on its own IO
    #: thread (the websocket server) turns this off: the core then only notes
    #: that the client is alive, which is most of what 10,000 clients send.
    echo_heartbeats: bool = True
    #: an edge's standing against its root (upstream.py), None unless this
    #: coordinator serves as an edge; it is checkpointed
    upstream: UpstreamState | None = None
    _now: float = field(default=-math.inf, init=False, repr=False)

    def __post_init__(self) -> None:
        #: the open connections by client id
        self.conns = self.connections.by_id
        #: job data from a file: only clients that fetch shards (hello.data) can train
        self.data_only = self.job.data.path is not None
        self.early_stop = EarlyStop(self.job.stop, self.spec)  # when the job ends (earlystop.py)

    # -- public API ----------------------------------------------------------------

    def connect(
        self, client_id: str, hello: m.Hello, now: float, *, address: str | None = None
    ) -> list[ev.Output]:
        """A connection opened and sent ``hello``; answer welcome (or refuse).
        ``address``: the peer's, when the driver knows it (refusals.py)."""
        out: list[ev.Output] = []
        if client_id in self.conns:
            raise ValueError(f"connect: client {client_id!r} is already connected")
        self._enter(now, out)
        if self.finished is not None:  # a client that missed the bye learns it now
            return out + finished_bye(client_id, self.finished.reason)
        try:
            version, offered = check_hello(self.job, hello, data_only=self.data_only)
        except ProtocolError as exc:
            return refusal(client_id, exc.code, exc.message)
        if hello.volunteer is not None:
            why = check_key(hello.volunteer) or None
            where = "hello.volunteer"
            if why is None and (why := check_name(hello.client)) is not None:
                where = "hello.client"  # shown beside the volunteer's credit
            if why is not None:
                return refusal(client_id, ErrorCode.BAD_FIELD, f"{where}: {why}")
        if self.verifier.refuses(hello.resume):
            return refusal(
                client_id,
                ErrorCode.BAD_FIELD,
                "hello.resume: this session was excluded (a result disagreed with the same "
                "task computed elsewhere)",
            )
        limits = negotiate(hello.limits, self.limits)
        self._take_over(hello.resume, now, out)
        rec, resumed = self.registry.join(
            client_id,
            name=hello.client,
            flops=hello.flops or DEFAULT_FLOPS,
            resume_id=hello.resume,
            now=now, kernel=hello.kernel,
        )  # fmt: skip
        conn = open_conn(
            self.job,
            self.spec,
            client_id,
            hello,
            limits,
            offered,
            seeded_v0=self.v0_crc is not None,
            serves_prefetch=self.prefetch,
        )
        conn.address = address
        # by the token it sent too: a forgotten session's token starts a new record
        marks = RefusalMarks.keys(address, rec.resume_id) + RefusalMarks.keys(None, hello.resume)
        if self.refusal_marks.marked(marks, now):
            # Its address or session was closed for refused updates: on probation.
            limit = self.job.validation.max_rejections
            rec.rejections = max(rec.rejections, limit - 1)
        self.connections.add(conn)
        vid = ""
        if hello.volunteer is not None:
            vid = self.credit.join(client_id, hello.volunteer, hello.client, now)
        answer = welcome(
            self.job,
            version=version,
            session_id=client_id,
            resume_token=rec.resume_id,
            limits=limits,
            prefetch=conn.prefetch,
            volunteer=vid,
        )
        self.connections.queue(conn, answer)
        out.append(
            ev.ClientJoined(
                client_id=client_id,
                name=rec.name,
                resumed=resumed,
                now=now,
                platform=hello.platform,
            )
        )
        self._dispatch(now, out)
        self.connections.flush_all(now, out)
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
        self.connections.flush_all(now, out)
        return out

    def disconnect(self, client_id: str, now: float, reason: str = "") -> list[ev.Output]:
        """The connection is gone (no-op if the core already closed it)."""
        out: list[ev.Output] = []
        self._advance(now)
        if client_id in self.conns:
            self._drop(client_id, reason or "disconnected", now, out)
            self._dispatch(now, out)
            self.connections.flush_all(now, out)
        return out

    def tick(self, now: float) -> list[ev.Output]:
        """Time passed: heartbeats, lease deadlines, round deadlines, paced frames."""
        out: list[ev.Output] = []
        self._enter(now, out)
        self.book.forget(now)
        self.registry.forget(now - self.book.retain_s)
        self.orphans.forget_holders(self.registry.take_forgotten(), now)
        if self.finished is None:
            timeout = self.job.lease.heartbeat_timeout_s
            late: list[str] = []
            for rec in self.registry.least_recently_seen():
                if not now > rec.last_seen + timeout:
                    break
                late.append(rec.client_id)
            for client_id in self.connections.in_join_order(late):
                conn = self.conns[client_id]
                self._close(conn, ErrorCode.TIMEOUT, f"no message for {timeout:g} s", now, out)
            self.orphans.expire_leases(now, out)
            self.orphans.expire(now)
            report = self.strategy.on_tick(now)
            if report is not None:
                self._stepped(report, now, out)
            limit = self.job.stop.max_time_s
            if limit is not None and self.started_at is not None and now >= self.started_at + limit:
                self._finish("max_time", now, out)
        self._dispatch(now, out)
        self.connections.flush_all(now, out)
        return out

    def next_wakeup(self) -> float | None:
        """The earliest time ``tick`` has something to do (None: only on new input)."""
        times = [self.connections.next_send_time()]
        if self.finished is None:
            times.append(self.book.next_deadline())
            oldest = next(self.registry.least_recently_seen(), None)
            if oldest is not None:
                times.append(oldest.last_seen + self.job.lease.heartbeat_timeout_s + 1e-9)
            times.append(self.strategy.next_deadline())
            times.append(self.connections.next_cool_end())
            times.append(self.orphans.next_expiry())
            if self.job.stop.max_time_s is not None and self.started_at is not None:
                times.append(self.started_at + self.job.stop.max_time_s)
        due = [t for t in times if t is not None]
        return min(due) if due else None

    # -- checkpoints (coordinator/core/checkpoint.py) -------------------------------

    def state_dict(self, *, params: bool = True) -> dict[str, Any]:
        """Everything needed to resume after a crash: acknowledged results survive."""
        return checkpoint.state_of(self, params=params)

    @property
    def merges_in_place(self) -> bool:
        """Every accepted result is one in-place sub-model merge (``MergedInPlace``):
        a log of them, replayed on a checkpoint, restores the model exactly."""
        return self.submodels is not None and self.strategy.merges_in_place

    def replay(
        self,
        merges: Iterable[tuple[int, int, Subnet, np.ndarray, float]],
        *,
        rows_as_of: list[np.ndarray] | None = None,
    ) -> int:
        """Apply logged merges again after ``restore`` (checkpoint.replay)."""
        return checkpoint.replay(self, merges, rows_as_of=rows_as_of)

    def _reference_norms(self) -> list[float]:
        """The norm check's yardstick: a few updates computed here (reference.py)."""
        return job_reference_norms(
            self.job,
            self.model.params,
            self.dataset,
            self.data.indices,
            local=self.strategy.task_kind == "local",
            optimizer=self.tasks.optimizer,
            seed=self.seed,
            seq=self.reference_seq,
        )

    def replace_model(self, data: np.ndarray, now: float) -> list[ev.Output]:
        """The model becomes ``data``, one version on (an edge rebasing onto its root's
        model, upstream.py); clients on older versions go on as after any step."""
        out: list[ev.Output] = []
        self._advance(now)
        if self.finished is not None:
            return out
        flat = np.asarray(data, dtype=np.float32)
        if flat.shape != self.model.params.data.shape:
            raise ValueError(
                f"replace_model: {flat.shape[0] if flat.ndim == 1 else flat.shape} values, "
                f"the model has {self.spec.num_params}"
            )
        if not np.isfinite(flat).all():
            raise ValueError("replace_model: the new model is not finite")
        with self.model.lock:
            self.model.params.data[:] = flat
            self.model.version += 1
            self.model.whole_steps += 1
        # The recent norms were of updates to another model, and a root's step can
        # move it far: honest updates to the new one then looked abnormal beside
        # them, and an edge closed its own players for it (tests/e2e/test_federation.py).
        # The yardstick starts again from the coordinator's own updates to this one.
        self.validator.restart(self._reference_norms())
        self._stepped(StepReport(stepped=True, merged=0), now, out)
        self._dispatch(now, out)
        self.connections.flush_all(now, out)
        return out

    # -- message handling ----------------------------------------------------------

    def _handle(
        self,
        conn: Conn,
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
                    self.connections.queue(conn, m.Heartbeat(seq=msg.seq, time=now, echo=msg.time))
            case m.Result():
                task = self.book.tasks.get(int(msg.task_id)) if msg.task_id.isdigit() else None
                subnet = None if task is None else task.subnet
                spec = None if subnet is None else subnet.sub
                layout = None
                if self.split is not None and task is not None and task.block is not None:
                    spec = self.split.spec_of(task.block)
                    if task.block == LOWER:  # the update, then its rows' boundary
                        rows = self.data.shard(task.shard).rows
                        layout = self.split.result_layout(LOWER, rows)
                lease = None if task is None else self.results.lease_for(task, rec)
                conn.uploads.start(
                    msg,
                    nbytes,
                    spec=spec,
                    layout=layout,
                    extra=int(layout is not None),
                    taken=lease is not None,
                    keep_wire=subnet is not None and self.merges_in_place,
                    codec=None if lease is None else lease.upload_codec,
                )
            case m.Chunk():
                upload = conn.uploads.chunk(msg, nbytes)
                if upload is not None:
                    self._follow(self.results.on_result(conn, rec, upload, now, out), now, out)
            case m.Prefetch():
                self.issuer.prefetch(conn, rec, msg)
            case m.Fetch():
                frames, served = self.data.answer(conn.client_id, msg, conn.limits, now)
                self.connections.queue_frames(conn, frames)  # behind what is queued (§13)
                out.append(served)
            case m.Decline():
                self.results.on_decline(conn, rec, msg, now, out)
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

    # -- dispatch ------------------------------------------------------------------

    def _dispatch(self, now: float, out: list[ev.Output]) -> None:
        """Give every idle client a task until the strategy says wait (a twin to
        check another client's result first, if one waits: replication.py)."""
        ready = self.verifier.ready
        while ready and self.finished is None:
            self._follow(self.results.release(ready.popleft(), now), now, out)
        ready.clear()  # the job finished: nothing more goes in
        if self.finished is not None:
            return
        if self.started_at is None and self.conns:
            self.started_at = now
        if not self.connections.has_waiting():
            return
        for conn in self.connections.waiting(now):
            rec = self.registry.get(conn.client_id)
            assert rec is not None
            view = self.issuer.view(conn, rec, connected=len(self.conns))
            plan = self.verifier.twin_for(rec, now) or self.strategy.task_for(view, now)
            if plan is None:
                continue  # this client waits; another may still get work (a reissue)
            queued = conn.state is ConnState.PREFETCH
            out.append(self.issuer.lease(conn, rec, plan, now, queued=queued))
            self.connections.leased(conn)

    # -- model steps, evaluation, stop ---------------------------------------------

    def _follow(self, f: FollowUp, now: float, out: list[ev.Output]) -> None:
        """What the result path left to the core, in its order (results.FollowUp)."""
        if f.step is not None:
            self._stepped(f.step, now, out)
        out.extend(f.after)
        for e in f.after:
            self.credit.observe(e)
        if f.close is not None and f.close[0] in self.conns:
            client_id, code, message = f.close
            self._close(self.conns[client_id], code, message, now, out)
        task = f.reissue
        if task is not None and task.state is TaskState.OPEN and not self.book.live_leases(task):
            self.orphans.lost(task, now, finished=self.finished is not None)

    def _stepped(self, report: StepReport, now: float, out: list[ev.Output]) -> None:
        for tid in report.dropped:
            task = self.book.tasks.get(tid)
            if task is not None and task.state is TaskState.OPEN:
                self.orphans.discard(tid)
                self.book.resolve_task(task, TaskState.DROPPED, now)
        if not report.stepped:
            return
        self.model.changed.mark(report.within)
        v = self.model.version
        out.append(ev.ModelUpdated(version=v, contributions=self.model.contributions, now=now))
        # The strategy's arithmetic (updates were checked); huge models when evaluated.
        small = self.spec.num_params <= FINITE_CHECK_EVERY_VERSION_MAX
        due = self.evaluator.due(v, now)
        if (small or due) and not self.model.params.is_finite():
            raise RuntimeError(f"model became non-finite at version {v}: a strategy bug")
        if (every := self.job.checkpoint.every_versions) and v % every == 0:
            out.append(ev.Checkpoint(version=v))
        stop = self.job.stop
        if due:
            e = self.evaluator.run(self.model.params, v, now)
            out.append(e)
            self.strategy.on_evaluation(e.loss)
            reason = self.early_stop.verdict(e, self.model.params, self.strategy, self.upstream)
            if reason is not None:
                self._finish(reason, now, out)
                return
        if stop.max_versions is not None and v >= stop.max_versions:
            self._finish("max_versions", now, out)

    def _finish(self, reason: str, now: float, out: list[ev.Output]) -> None:
        if self.finished is not None:
            return
        best = self.early_stop.restore(self.model, now, out) if reason == "converged" else None
        v = self.model.version
        last = self.evaluator.last
        if last is None or last.version != v:
            last = self.evaluator.run(self.model.params, v, now)
            out.append(last)
        for task in self.book.open_tasks():
            self.book.resolve_task(task, TaskState.DROPPED, now)
        self.orphans.clear()
        acc = last.accuracy
        self.finished = ev.JobFinished(
            version=v, reason=reason, accuracy=acc, now=now, best_of=best
        )
        out.append(self.finished)
        if self.job.checkpoint.every_versions:
            out.append(ev.Checkpoint(version=v))
        for conn in list(self.conns.values()):
            # Results still uploading are not taken: each is answered (§6), before
            # the bye, like any result the server does not take.
            for task_id in conn.uploads.in_flight():
                ack = m.Ack.trusted(task_id=task_id, accepted=False, reason=Reject.STALE.value)
                self.connections.queue(conn, ack)
            conn.outbox.flush(now, out)  # type: ignore[arg-type]
            # Every result taken so far is acknowledged before the bye: acks still
            # held by pacing go now (a few dozen bytes each). Tasks, model chunks
            # and shard data behind them are for tasks just dropped: never sent.
            out.extend(s for s in conn.outbox if isinstance(s.message, m.Ack))
            conn.outbox.clear()
            out.extend(finished_bye(conn.client_id, reason))
            self._drop(conn.client_id, reason, now, out)

    # -- connections and pacing ----------------------------------------------------

    def _take_over(self, resume_id: str | None, now: float, out: list[ev.Output]) -> None:
        """A resume of a session still connected here closes the older connection
        (``REPLACED``, most likely half-open; MQTT's rule): the resume takes over."""
        old = self.registry.lookup(resume_id) if resume_id else None
        if old is not None and old.connected and old.client_id in self.conns:
            msg = "a newer connection resumed this session"
            self._close(self.conns[old.client_id], ErrorCode.REPLACED, msg, now, out)

    @property
    def now(self) -> float:
        """The latest time the driver gave (-inf before the first call)."""
        return self._now

    def _enter(self, now: float, out: list[ev.Output]) -> None:
        """The clock; a core restored from a run that ended ends at its first input
        while that stop still holds (earlystop.ends_again)."""
        first = self._now == -math.inf
        self._advance(now)
        if first and self.finished is None:
            reason = ends_again(self.job.stop, self.model.version, self.ended)
            if reason is not None:
                self._finish(reason, now, out)

    def _advance(self, now: float) -> None:
        self._now = advance_clock("coordinator", self._now, now)

    def _close(
        self, conn: Conn, code: ErrorCode, message: str, now: float, out: list[ev.Output]
    ) -> None:
        """Close a misbehaving or silent peer: error frame now (unpaced), then Close."""
        if conn.client_id not in self.conns:
            return
        out.extend(refusal(conn.client_id, code, message))
        self._drop(conn.client_id, f"closed: {code.name}", now, out)

    def _drop(self, client_id: str, reason: str, now: float, out: list[ev.Output]) -> None:
        self.connections.remove(client_id)
        self.registry.leave(client_id, now)
        # The queued lease first, so that it is not promoted to current in between.
        for lease in (self.book.queued_lease_of(client_id), self.book.live_lease_of(client_id)):
            if lease is not None:
                self.book.end(lease, LeaseState.LOST, now)
                task = self.book.tasks[lease.task_id]
                self.orphans.lost(task, now, finished=self.finished is not None)
        self.orphans.forget_holders(self.registry.take_forgotten(), now)
        out.append(ev.ClientLeft(client_id=client_id, reason=reason, now=now))

    # -- introspection (tests, dashboard) ------------------------------------------

    @property
    def version(self) -> int:
        return self.model.version

    @property
    def params(self) -> Params:
        return self.model.params

    @property
    def model_contributions(self) -> int:
        """Results merged into the model so far (an edge reports it to its root)."""
        return self.model.contributions

    @property
    def accepted_results(self) -> int:
        return self.results.accepted

    def clients(self) -> list[ClientRecord]:
        return self.registry.connected()
