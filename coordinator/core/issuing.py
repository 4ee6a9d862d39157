"""Giving a client a task: the plan sized to the client, its download, its lease.

``TaskIssuer.lease`` turns a strategy's plan (or a replica's) into a task with a
lease whose deadline covers the client's measured compute and its link, queues
the task message and its model frames behind whatever the client has queued, and
returns the ``TaskLeased`` event. A plan sized ``tau = "auto"`` computes for the
job's ``task_seconds`` and ``transfer_ratio`` times its transfer at the client's
measured speed (leases.task_steps; ``prefetch_transfer_ratio`` for a connection
that prefetches), the transfer counted in its link's codecs (linkcodecs.py), its
lr scaled as the strategy says.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable

from coordinator.core import events as ev
from coordinator.core.config import JobConfig
from coordinator.core.connections import Conn, Connections
from coordinator.core.data import DataCatalog
from coordinator.core.downloads import ModelDistribution
from coordinator.core.layersplit import LOWER, SplitBlocks
from coordinator.core.leases import LeaseBook, TaskPlan, lease_seconds, task_steps, task_work
from coordinator.core.orphans import Orphans
from coordinator.core.registry import ClientRecord
from coordinator.core.replication import Replicator
from coordinator.core.strategies import ClientView, ModelState, Strategy
from coordinator.core.submodel import SubmodelPlanner
from coordinator.core.taskwriter import TaskWriter
from nn.spec import ModelSpec
from protocol import messages as m

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class TaskIssuer:
    """The core's task-giving half; its collaborators are the core's own parts."""

    job: JobConfig
    spec: ModelSpec
    model: ModelState
    book: LeaseBook
    data: DataCatalog
    strategy: Strategy
    submodels: SubmodelPlanner | None
    split: SplitBlocks | None
    verifier: Replicator
    orphans: Orphans
    downloads: ModelDistribution
    tasks: TaskWriter
    connections: Connections
    flops_per_sample: float
    v0_crc: int | None
    #: whether the job was told its shards make tasks spend longer on the link
    #: than on compute (once a job)
    said_short_shards: bool = False

    def view(self, conn: Conn, rec: ClientRecord, *, connected: int) -> ClientView:
        """What the strategy may know of this client when it asks for work; the
        shards it holds only where fetching one takes longer than its task
        computes, and longer than ``task_seconds`` (affinity: on lan a fetch is
        cheap however short the task, and affinity was measured worse there).
        A sub-model task computes a slice this does not estimate: there
        ``task_seconds`` alone, as before."""
        held: tuple[int, ...] = ()
        limits = conn.limits
        # task_seconds first: on lan (every lease there) no task is sized for this
        slow = (
            conn.data
            and rec.shards_held
            and self.data.slow_to_fetch(limits, self.job.strategy.task_seconds)
            and (
                self.submodels is not None
                or self.data.slow_to_fetch(limits, self.compute_seconds(conn, rec))
            )
        )
        if slow:
            held = tuple(rec.shards_held)
        return ClientView(
            client_id=conn.client_id,
            version_held=rec.version_held,
            connected=connected,
            shards=conn.data,
            boundary=conn.boundary,
            held=held,
        )

    def compute_seconds(self, conn: Conn, rec: ClientRecord) -> float:
        """How long this client's next whole-model task computes at its measured
        rate, on a shard of the mean size: what fetching a shard is weighed
        against. Not the job's ``task_seconds``: a slow link's task computes
        ``transfer_ratio`` times its transfers, and a large model's 27-s task
        re-trained the shard it held while a 0.8-s fetch would have varied it
        (docs/performance.md, "Session 14")."""
        st = self.job.strategy
        batch = self.job.data.batch
        if st.tau == "auto":
            steps = self._auto_steps(conn, rec, self.data.mean_rows, batch)()
        else:
            steps = st.tau
        return self._compute_s(steps, batch, rec.rate())

    def prefetch(self, conn: Conn, rec: ClientRecord, msg: m.Prefetch) -> None:
        """A client asks for its next task while it computes: queued behind it
        (Connections.prefetch) where its connection was offered prefetch and it
        pays now."""
        pays = conn.prefetch and self.prefetch_pays(conn, rec)
        self.connections.prefetch(conn, msg, self.book, pays=pays)

    def prefetch_pays(self, conn: Conn, rec: ClientRecord) -> bool:
        """Whether to serve this client's ``prefetch``: always under ``lease.prefetch
        = true``; under ``auto`` where its running task computes at least as long
        as a model takes to download, so that the next one's download hides behind
        it. On a link slower still a queued task only doubles the client's tasks
        in flight: the large preset's 8 roblox players (27 s of compute, 42 s a
        model) reached a loss of 0.1 at 493 s instead of 213 s with every prefetch
        served (docs/performance.md, "Session 15")."""
        if self.job.lease.prefetch is True:
            return True
        lease = self.book.live_lease_of(conn.client_id)
        if lease is None:
            return False
        task = self.book.tasks[lease.task_id]
        download_s = conn.codecs.model_bytes / conn.limits.bytes_per_s
        return self._compute_s(task.steps, task.batch, rec.rate()) >= download_s

    def _compute_s(self, steps: int, batch: int, rate: float) -> float:
        """Seconds ``steps`` steps of ``batch`` rows take at ``rate`` FLOP/s."""
        return steps * self.flops_per_sample * batch / max(rate, 1.0)

    def _auto_steps(
        self, conn: Conn, rec: ClientRecord, rows: int, batch: int
    ) -> Callable[..., int]:
        """leases.task_steps for this client under ``tau = "auto"``; called with
        overrides (``rows=0``: without the shard's cap) where a caller asks again."""
        st = self.job.strategy
        return functools.partial(
            task_steps,
            flops_per_step=self.flops_per_sample * batch,
            flops_per_s=rec.rate(),
            rows=rows,
            batch=batch,
            max_epochs=st.max_epochs,
            tau_min=st.tau_min,
            tau_max=st.tau_max,
            transfer_bytes=conn.codecs.round_trip_bytes,  # the model down, the update up
            bytes_per_s=conn.limits.bytes_per_s,
            task_seconds=st.task_seconds,
            # a prefetching client's transfers run while it computes
            transfer_ratio=st.prefetch_transfer_ratio if conn.prefetch else st.transfer_ratio,
        )

    def sized(self, plan: TaskPlan, conn: Conn, rec: ClientRecord, rows: int) -> TaskPlan:
        """A new local task's plan with this client's own number of local steps
        (``tau = "auto"``), the lr multiplier the strategy sets now, and its
        share of a round on the progress clock (``round_seconds``)."""
        st = self.job.strategy
        auto = self._auto_steps(conn, rec, rows, plan.batch)
        steps = plan.steps
        if st.tau == "auto":
            steps = auto()
            if not self.said_short_shards:
                self._say_if_link_bound(steps, plan.batch, rec.rate(), conn, rows, auto)
        round_steps = auto(
            transfer_bytes=0.0, bytes_per_s=1.0, task_seconds=st.round_seconds, transfer_ratio=0.0
        )
        return dataclasses.replace(
            plan,
            steps=steps,
            lr_scale=self.strategy.lr_scale(steps),
            work=task_work(steps, round_steps),
        )

    def _say_if_link_bound(
        self,
        steps: int,
        batch: int,
        rate: float,
        conn: Conn,
        rows: int,
        auto: Callable[..., int],
    ) -> None:
        """Warn, once a job, when a task capped by its shard (``max_epochs``
        passes) computes for less than its transfers: on slow links most of a
        player's time is then the link, and fewer, larger shards would carry more
        training per byte (64 roblox players reached 0.78 1.3x sooner on 16
        shards than on 64; docs/performance.md, "Session 12")."""
        compute_s = self._compute_s(steps, batch, rate)
        transfer_s = conn.codecs.round_trip_bytes / conn.limits.bytes_per_s  # as task_steps
        # Sized by its transfer ratio, a task computes at least its transfer unless its
        # shard caps it: only a link-bound task asks again without the cap.
        if compute_s >= transfer_s or steps >= auto(rows=0):
            return
        self.said_short_shards = True
        log.warning(
            "tasks are capped at %g pass(es) over their %d-row shard: %d steps, %.2g s of "
            "compute at the client's %.3g FLOP/s against %.2g s of model down and update "
            "up; fewer, larger shards (data.shards) would carry more training per byte",
            self.job.strategy.max_epochs,
            rows,
            steps,
            compute_s,
            rate,
            transfer_s,
        )

    def lease(
        self,
        conn: Conn,
        rec: ClientRecord,
        plan: TaskPlan,
        now: float,
        *,
        queued: bool = False,
    ) -> ev.TaskLeased:
        """Lease a task to the client and queue its frames; ``queued``: behind the
        task it still computes (a prefetch)."""
        if plan.reissue is not None:
            task = self.book.tasks[plan.reissue]
            if task.version != self.model.version:
                raise RuntimeError(f"strategy reissued task {task.task_id} of an old version")
        else:
            v = self.model.version if plan.version is None else plan.version
            rows = self.data.shard(plan.shard).rows  # a mean's weight (FedAvg)
            if plan.kind == "local" and plan.block is None and plan.version is None:
                plan = self.sized(plan, conn, rec, rows)  # (a twin keeps its primary's)
            task = self.book.new_task(plan, version=v, now=now, rows=rows)
            if self.submodels is not None:
                task.subnet = self.submodels.choose(
                    bytes_per_s=conn.limits.bytes_per_s,
                    flops_per_s=rec.rate(),
                    samples=task.steps * task.batch,
                    round=task.round,
                )
            self.strategy.on_task_created(task)
        rec.hold_shard(task.shard)
        replica = self.verifier.leased(task, plan, rec, len(self.connections.by_id))
        self.orphans.discard(task.task_id)
        # A client that builds version 0 from the init seed gets no model at all.
        sub = task.subnet
        part = None if self.split is None or task.block is None else self.split.spec_of(task.block)
        seeded = conn.seeded_init and rec.version_held is None and task.version == 0
        if sub is not None:  # its slice, whatever the client holds
            seeded = False
            dl = self.downloads.subnet(task, conn.limits, conn.spans, conn.codecs.model)
            conn.delta_chain = 0
        elif part is not None:  # a layer-split block, the same
            assert self.split is not None and task.block is not None
            seeded = False
            block = self.split.slice(task.block, self.model.params)
            dl = self.downloads.part(task, block, conn.limits, conn.spans, conn.codecs.model)
            conn.delta_chain = 0
        else:
            dl, conn.delta_chain = self.downloads.plan(
                task_version=task.version,
                held=rec.version_held,
                seeded=seeded,
                wants_deltas=conn.deltas,
                chain=conn.delta_chain,
                limits=conn.limits,
                spans=conn.spans,
                codecs=conn.codecs,
            )
        model_bytes = dl.nbytes
        shard = self.data.shard(task.shard)
        # The first task naming a shard may wait for its transfer (a cold cache).
        data_bytes = 0
        if conn.data and shard.sha256 not in conn.shards_named:
            if task.shard < len(self.data.shards):  # a boundary shard is named once anyway
                conn.shards_named.add(shard.sha256)
            data_bytes = len(shard.blob)
        trained = part or (self.spec if sub is None else sub.sub)
        per_sample = self.flops_per_sample if trained is self.spec else trained.flops_per_sample()
        flops = per_sample * task.steps * task.batch
        # A queued task starts when the one in front is done: about one task later.
        compute_s = flops / rec.rate() * (2 if queued else 1)
        # the update up: a whole model's in the link's codec, else the slice's in fp32
        codec, up_bytes = conn.codecs.update_for(self.strategy.averaged_with())
        up_bytes = up_bytes if trained is self.spec else trained.nbytes
        lease_s = lease_seconds(
            compute_s=compute_s,
            nbytes=model_bytes + data_bytes + up_bytes,
            bytes_per_s=conn.limits.bytes_per_s,
            min_s=self.job.lease.min_s,
            slack=self.job.lease.slack,
        )
        lease = self.book.lease(
            task,
            conn.client_id,
            now=now,
            deadline=now + lease_s,
            queued=queued,
            holder=rec.resume_id,
        )
        lease.upload_codec = codec
        msg = self.tasks.message(
            task,
            dl,
            deadline=float(lease_s),
            shards=conn.data,
            seeded=seeded,
            init_crc=self.v0_crc,
            part=part,
            boundary=self.split.cut if part is not None and task.block == LOWER else None,
            upload_codec=codec,
        )
        task_bytes = self.connections.queue(conn, msg)
        self.connections.queue_frames(conn, zip(dl.chunks, dl.frames, strict=True))
        rec.version_sent = dl.version
        rec.version_held = dl.version if trained is self.spec else None  # a slice is none
        return ev.TaskLeased(
            client_id=conn.client_id,
            task_id=task.task_id,
            lease_id=lease.lease_id,
            version=dl.version,
            shard=task.shard,
            deadline=lease.deadline,
            now=now,
            download=dl.kind,
            download_bytes=model_bytes,
            task_bytes=task_bytes,
            queued=queued,
            replica=replica,
        )
