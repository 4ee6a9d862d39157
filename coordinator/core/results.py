"""A client's answers to its tasks: where a finished upload goes, and a ``decline``.

The core hands each fully reassembled upload (coordinator/core/uploads.py) to
:meth:`ResultPath.on_result`, which decides, in this order:

1. whose it is: a result counts only from a client that holds (or held, before it resumed) a
   lease on the task, since task ids are sequential and easy to guess (``not_leased``, not
   counted against the client);
2. whether it is still wanted: a resolved task is answered ``duplicate`` (taken already) or
   ``stale`` (dropped), an id never issued ``unknown_task``;
3. whether it is sound: the task's model version, then the update checks (validation.py);
   these refusals count, and a client over ``validation.max_rejections`` is closed;
4. where it goes: a copy of a replicated task is taken (held) now and applied once compared
   (replication.py, released through :meth:`release`); any other goes to the strategy at once
   (:meth:`apply`), which may still refuse it (too stale), and then the task is dropped.

A taken result is acknowledged ``accepted=True`` and resolves its task; every refusal with its
reason. Only accepted updates move the reference norms and ``accepted`` (the count a checkpoint
keeps). A ``decline`` (docs/protocol.md §3.13) ends the lease at once instead of at its
deadline (:meth:`ResultPath.on_decline`). A decline for ``diverged`` and an update
refused ``nonfinite`` are reports against the task's lr, accepted results the
opposite (strategies/divergence.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from coordinator.core import events as ev
from coordinator.core.config import JobConfig
from coordinator.core.connections import Conn, Connections
from coordinator.core.credit import CreditBook
from coordinator.core.layersplit import BOUNDARY
from coordinator.core.leases import Lease, LeaseBook, LeaseState, Task, TaskState
from coordinator.core.orphans import Orphans
from coordinator.core.refusals import RefusalMarks
from coordinator.core.registry import ClientRecord
from coordinator.core.replication import Exclusion, Release, Replicator
from coordinator.core.strategies import ModelState, Outcome, StepReport, Strategy
from coordinator.core.uploads import Dropped, Upload
from coordinator.core.validation import Reject, UpdateValidator
from protocol import messages as m
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FollowUp:
    """What the core does next, in this order: step the model (events, evaluation,
    stop), emit ``after``, close ``close`` = (client id, code, message), then lease
    ``reissue`` again if it is still open with no live lease."""

    step: StepReport | None = None
    after: list[ev.Output] = field(default_factory=list)
    close: tuple[str, ErrorCode, str] | None = None
    reissue: Task | None = None


NOTHING = FollowUp()


class ResultPath:
    """The result path of one core (module docstring). It answers and records;
    what only the core can do (step, close, reissue) it returns as a FollowUp."""

    __slots__ = (
        "_book",
        "_conns",
        "_credit",
        "_flops_per_sample",
        "_job",
        "_marks",
        "_model",
        "_orphans",
        "_strategy",
        "_validator",
        "_validators",
        "_verifier",
        "accepted",
    )

    def __init__(
        self,
        *,
        job: JobConfig,
        model: ModelState,
        book: LeaseBook,
        strategy: Strategy,
        validator: UpdateValidator,
        verifier: Replicator,
        conns: Connections,
        orphans: Orphans,
        flops_per_sample: float,
        block_validators: dict[int, UpdateValidator] | None = None,
        marks: RefusalMarks | None = None,
        credit: CreditBook | None = None,
    ) -> None:
        self._job = job
        #: closes for refused updates, remembered past the connection (refusals.py)
        self._marks = marks if marks is not None else RefusalMarks()
        #: a layer-split job's norm check per block (its blocks' updates differ)
        self._validators = block_validators or {}
        self._model = model
        self._book = book
        self._strategy = strategy
        self._validator = validator
        self._verifier = verifier
        self._conns = conns
        self._orphans = orphans
        self._flops_per_sample = flops_per_sample
        #: each volunteer's credit (credit.py); None: not kept
        self._credit = credit
        #: results applied to the model (a checkpoint keeps it)
        self.accepted = 0

    def on_result(
        self,
        conn: Conn,
        rec: ClientRecord,
        upload: Upload,
        now: float,
        out: list[ev.Output],
    ) -> FollowUp:
        result = upload.result
        tid = int(result.task_id) if result.task_id.isdigit() else -1
        book = self._book
        task = book.tasks.get(tid)
        lease = self.lease_for(task, rec) if task is not None else None
        if task is not None and lease is None:
            # A result counts only from a client that holds (or held, before it resumed)
            # a lease on the task: task ids are sequential, so easy to guess.
            log.info("client %s: result for task %s it was never leased", rec.client_id, tid)
            return self._reject(conn, rec, result.task_id, Reject.NOT_LEASED, now, out, count=False)
        if lease is not None and lease.live:
            book.end(lease, LeaseState.DONE, now)
        if task is None:  # resolved (its outcome kept a while), forgotten or never issued
            outcome = book.outcome(tid)
            if outcome is TaskState.ACCEPTED:
                reason = Reject.DUPLICATE
            elif outcome is TaskState.DROPPED or 0 < tid < book.next_task_id:
                reason = Reject.STALE
            else:
                reason = Reject.UNKNOWN_TASK
            return self._reject(conn, rec, result.task_id, reason, now, out, count=False)
        if isinstance(upload.reasm, Dropped):
            # Not held when its header came (the core asks as the upload starts), held
            # now: an id sent before it was issued (a guess). Its chunks are gone.
            f = self._reject(conn, rec, result.task_id, Reject.NOT_LEASED, now, out, count=False)
            return FollowUp(close=f.close, reissue=task)
        update = upload.update
        if result.model_version != task.version:
            f = self._reject(conn, rec, result.task_id, Reject.VERSION, now, out, count=True)
            return FollowUp(close=f.close, reissue=task)
        # A sub-model task's delta stays in its subnet's layout: the strategy places
        # it (task.subnet), in place where it can, so no model-sized copy is made.
        sub = task.subnet
        validator = self._validator_of(task)
        reject, norm = validator.check(
            update, size=None if sub is None else sub.sub.num_params, effort=_effort(task)
        )
        if reject is None and task.block is not None:
            reject = self._take_boundary(task, upload, self._validators[BOUNDARY])
        if reject is not None:
            if reject is Reject.NONFINITE:  # a client that uploads a diverged update
                self._diverged(task)
            f = self._reject(conn, rec, result.task_id, reject, now, out, count=True)
            return FollowUp(close=f.close, reissue=task)
        verifier = self._verifier
        unit = verifier.unit_of(task.task_id)
        clip = 1.0
        if unit is None:
            clip = validator.clip_scale(norm, effort=_effort(task))
            outcome = self.apply(task, update, norm, rec.resume_id, now, checked=False, clip=clip)
            if not outcome.accepted:
                self._orphans.discard(task.task_id)
                book.resolve_task(task, TaskState.DROPPED, now)
                reason = Reject(outcome.reason or "stale")
                return self._reject(conn, rec, result.task_id, reason, now, out, count=False)
            staleness = outcome.staleness
        else:  # a copy of a replicated task: taken now, in the model once checked
            outcome, staleness = None, self._model.version - task.version
        self._orphans.discard(task.task_id)
        book.resolve_task(task, TaskState.ACCEPTED, now)
        self._strategy.divergence.accepted(task.task_id)
        rec.accepted += 1
        # Refusals fade as results are accepted: a client is closed for a run of
        # bad updates, not for a few spread over a long session.
        rec.rejections = max(0, rec.rejections - 1)
        rec.declined_in_row = 0
        if (
            sub is None
            and book.live_lease_of(conn.client_id) is None
            and rec.version_sent == task.version
        ):
            # It holds this task's model, unless a later task (a prefetch) replaced it.
            rec.version_held = task.version
        samples = result.samples or task.steps * task.batch
        per_sample = self._flops_per_sample if sub is None else sub.sub.flops_per_sample()
        rec.observe_speed(per_sample * samples, result.compute_seconds)
        if self._credit is not None:  # the FLOPs the server sized, not the client's claim
            work = per_sample * task.steps * task.batch
            self._credit.accepted(conn.client_id, task.task_id, work, replicated=unit is not None)
        self._conns.queue(conn, m.Ack.trusted(task_id=result.task_id, accepted=True))
        out.append(
            ev.ResultAccepted(
                client_id=conn.client_id,
                task_id=task.task_id,
                staleness=staleness,
                version=self._model.version,
                now=now,
                frame_bytes=upload.frame_bytes,
                payload_bytes=upload.payload_bytes,
                replica=verifier.is_twin(task.task_id),
            )
        )
        verifier.delivered(task)
        if unit is not None:
            verifier.arrived(unit, task, rec, update, norm, now)
        elif outcome is not None and outcome.step is not None:
            step = outcome.step
            after: list[ev.Output] = []
            if step.within is not None and step.update is not None:
                after.append(
                    ev.MergedInPlace(
                        task_id=task.task_id,
                        version=self._model.version,
                        subnet=step.within,
                        update=step.update,
                        scale=step.scale,
                        now=now,
                        wire=None if upload.wire is None else tuple(upload.wire),
                        clip=clip,
                    )
                )
            return FollowUp(step=step, after=after)
        return NOTHING

    def on_decline(
        self, conn: Conn, rec: ClientRecord, msg: m.Decline, now: float, out: list[ev.Output]
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
        book = self._book
        lease = None
        for held in (book.live_lease_of(cid), book.queued_lease_of(cid)):
            if held is not None and str(held.task_id) == msg.task_id:
                lease = held
        if lease is None:
            log.debug("client %s: decline of task %s ignored", cid, msg.task_id)
            return
        task = book.tasks[lease.task_id]
        book.end(lease, LeaseState.DECLINED, now)
        rec.version_held = None  # it may have dropped the download
        rec.declined += 1
        rec.declined_in_row += 1
        self._conns.declined(cid, rec.declined_in_row, now)
        reissued = self._orphans.declined(task, now)
        log.info("client %s declined task %s: %s", cid, msg.task_id, msg.reason)
        if m.decline_word(msg.reason) == m.DIVERGED:
            self._diverged(task)
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

    def apply(
        self,
        task: Task,
        update: np.ndarray,
        norm: float,
        holder: str,
        now: float,
        *,
        checked: bool,
        clip: float | None = None,
    ) -> Outcome:
        """Hand a validated update to the strategy, clipped to the median norm now
        (``clip``: that factor, when the caller took it already).
        ``checked``: replication compared it; an unchecked one is journaled."""
        validator = self._validator_of(task)
        scale = validator.clip_scale(norm, effort=_effort(task)) if clip is None else clip
        if scale < 1.0:
            update = update * np.float32(scale)
        journal = not checked and self._verifier.journals
        before = self._model.params.data.copy() if journal else None
        had_boundary = task.boundary is not None
        outcome = self._strategy.on_result(task, update, now)
        task.boundary = None
        if outcome.accepted:
            validator.accept(norm * scale, effort=_effort(task))
            if had_boundary:
                self._validators[BOUNDARY].accept(task.boundary_norm)
            self.accepted += 1
            if not checked:
                self._verifier.applied(holder, before, outcome)
        return outcome

    def release(self, item: Release | Exclusion | ev.Output, now: float) -> FollowUp:
        """Carry out one thing replication decided (coordinator/core/replication.py):
        a result that goes in now, a client excluded, a comparison made. The core
        takes them in order while the job runs."""
        match item:
            case Release():  # (too stale by now under max_staleness: not applied)
                outcome = self.apply(
                    item.task, item.update, item.norm, item.holder, now, checked=item.checked
                )
                return FollowUp(step=outcome.step)
            case Exclusion():
                step = None
                if item.revert is not None:  # its unchecked steps, subtracted again
                    with self._model.lock:
                        self._model.params.data -= item.revert
                        self._model.version += 1
                        self._model.whole_steps += 1
                    step = StepReport(stepped=True, merged=0)
                close = None
                if item.close:
                    msg = f"excluded: the result of task {item.event.task_id} disagreed"
                    close = (item.event.client_id, ErrorCode.BAD_FIELD, msg)
                return FollowUp(step=step, after=[item.event], close=close)
            case _:
                return FollowUp(after=[item])

    def _validator_of(self, task: Task) -> UpdateValidator:
        return self._validator if task.block is None else self._validators[task.block]

    @staticmethod
    def _take_boundary(task: Task, upload: Upload, check: UpdateValidator) -> Reject | None:
        """A layer-split lower result's boundary goes with its task to the strategy,
        which makes a shard of it for upper tasks: it is held to a norm check of
        its own (finite, and not above ``norm_multiple`` × the median of those
        taken), as an update is, since garbage there would train the upper block
        on it. (After a ReLU activations are never negative, but a codec may
        round a zero to a tiny negative, and the cut's activation may be another,
        so signs are not checked.)"""
        h = upload.boundary
        if h is None:
            return None
        flat = h.reshape(-1)
        reject, norm = check.check(flat, size=flat.size)
        if reject is not None:
            return reject
        task.boundary, task.boundary_norm = h, norm
        return None

    def lease_for(self, task: Task, rec: ClientRecord) -> Lease | None:
        """The client's latest lease on ``task``, under this connection or one it
        resumed (leases name the record's resume id, which outlives connections)."""
        for lid in reversed(task.leases):
            lease = self._book.leases[lid]
            if lease.holder == rec.resume_id:
                return lease
        return None

    def _diverged(self, task: Task) -> None:
        """Its holder found ``task``'s training not finite: a report against its lr."""
        if task.kind == "local":
            guard = self._strategy.divergence
            guard.diverged(task.task_id, task.lr_scale, self._book.next_task_id)

    def _reject(
        self,
        conn: Conn,
        rec: ClientRecord,
        task_id: str,
        reason: Reject,
        now: float,
        out: list[ev.Output],
        *,
        count: bool,
    ) -> FollowUp:
        tid = int(task_id) if task_id.isdigit() else -1
        self._conns.queue(conn, m.Ack.trusted(task_id=task_id, accepted=False, reason=reason.value))
        out.append(
            ev.ResultRejected(client_id=conn.client_id, task_id=tid, reason=reason.value, now=now)
        )
        if count:
            rec.rejections += 1
            limit = self._job.validation.max_rejections
            if rec.rejections >= limit:
                msg = f"{rec.rejections} updates rejected (limit {limit})"
                self._marks.mark(RefusalMarks.keys(conn.address, rec.resume_id), now)
                return FollowUp(close=(conn.client_id, ErrorCode.BAD_FIELD, msg))
        return NOTHING


def _effort(task: Task) -> float:
    """What an honest update's norm grows with: its steps, each at its lr's scale."""
    return task.steps * task.lr_scale
