"""Tasks (work units) and leases (attempts to get a task done by one client).

A *task* is a unit of work ("from model version v, on shard s with sampling seed z, compute a
gradient / take tau local steps"); a *lease* hands one task to one client until a deadline. A
task may be leased several times: the first result for an OPEN task is taken (ACCEPTED), any
later one is acknowledged but never applied, and a DROPPED task's results are acknowledged as
stale. Transitions (a missing entry is a programming error, raised as ``LeaseError``)::

    task:  OPEN   -> ACCEPTED | DROPPED
    lease: LEASED -> DONE       result received from this lease's client
                   | EXPIRED    deadline passed before a result
                   | LOST       client disconnected or timed out
                   | CANCELLED  task accepted from another lease, or dropped
                   | DECLINED   the client said it will not do it (``decline``)

Every lease resolves; what happens to the task after EXPIRED/LOST is the strategy's call. A
client holds at most one *current* lease and, after a prefetch (docs/protocol.md §3.12), one
*queued* lease that becomes current when the current one resolves; only a client holding no
lease is released (``on_release``) to get new work. A resolved task leaves the book with its
leases; an accepted one's outcome is kept ``retain_s`` seconds, so a late copy is answered
``duplicate``. Why, and bounded memory: docs/coordinator.md ("Tasks and leases").
"""

from __future__ import annotations

import enum
import heapq
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from protocol.states import checked_move

if TYPE_CHECKING:
    import numpy as np

    from nn.subnet import Subnet


class TaskState(enum.Enum):
    OPEN = "open"
    ACCEPTED = "accepted"
    DROPPED = "dropped"


class LeaseState(enum.Enum):
    LEASED = "leased"
    DONE = "done"
    EXPIRED = "expired"
    LOST = "lost"
    CANCELLED = "cancelled"
    DECLINED = "declined"


TASK_TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TaskState.OPEN: frozenset({TaskState.ACCEPTED, TaskState.DROPPED}),
    TaskState.ACCEPTED: frozenset(),
    TaskState.DROPPED: frozenset(),
}

LEASE_TRANSITIONS: dict[LeaseState, frozenset[LeaseState]] = {
    LeaseState.LEASED: frozenset(
        {
            LeaseState.DONE,
            LeaseState.EXPIRED,
            LeaseState.LOST,
            LeaseState.CANCELLED,
            LeaseState.DECLINED,
        }
    ),
    LeaseState.DONE: frozenset(),
    LeaseState.EXPIRED: frozenset(),
    LeaseState.LOST: frozenset(),
    LeaseState.CANCELLED: frozenset(),
    LeaseState.DECLINED: frozenset(),
}


class LeaseError(RuntimeError):
    """An illegal task or lease transition: a bug in the core, never a client's fault."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskPlan:
    """What a strategy wants done; the core turns it into a Task and a Lease.

    ``kind`` is ``"gradient"`` (one gradient on a batch) or ``"local"`` (``steps``
    local optimizer steps, result is the delta). ``reissue`` names an OPEN task
    to lease again instead of creating a new one. ``version`` (None: the current
    one) is set only for a replica of an older task (coordinator/core/replication.py).
    """

    kind: str
    shard: int
    seed: int
    steps: int
    batch: int
    round: int | None = None
    reissue: int | None = None
    version: int | None = None
    #: a layer-split job's block (0 lower, 1 upper; coordinator/core/layersplit.py)
    block: int | None = None
    #: the task's lr is the job's times this (strategy.lr_scaling)
    lr_scale: float = 1.0
    #: its share of a round's task on the progress clock (task_work), 0..1
    work: float = 1.0


@dataclass(slots=True, kw_only=True)
class Task:
    task_id: int
    kind: str
    version: int
    shard: int
    seed: int
    steps: int
    batch: int
    round: int | None
    created_at: float
    state: TaskState = TaskState.OPEN
    #: when the task last lost its only live lease (for the resume grace)
    orphaned_at: float | None = None
    leases: list[int] = field(default_factory=list)
    #: clients that held a lease on it, so a reissue goes to someone else
    clients: list[str] = field(default_factory=list)
    #: rows of its shard, from the coordinator's own catalog (never a count a
    #: client claims): what a mean of results weights it by (FedAvg); None: unknown
    rows: int | None = None
    #: a sub-model task's subnet (nn/subnet.py): what its client trains and
    #: uploads, in the subnet's layout; None: the whole model
    subnet: Subnet | None = None
    #: a layer-split task's block (None: the whole model) and that block's own
    #: version when the task was made (its staleness counts the block's steps)
    block: int | None = None
    block_version: int = 0
    #: a lower block's result: its rows' boundary activations and their norm
    #: (checked, counted once merged), until merged
    boundary: np.ndarray | None = None
    boundary_norm: float = 0.0
    #: its lr is the job's times this (strategy.lr_scaling; a twin takes its primary's)
    lr_scale: float = 1.0
    #: its share of a round's task on the plateau's and early stop's clock (task_work)
    work: float = 1.0

    def move(self, to: TaskState) -> None:
        self.state = checked_move(
            f"task {self.task_id}", TASK_TRANSITIONS, self.state, to, LeaseError
        )


@dataclass(slots=True, kw_only=True)
class Lease:
    lease_id: int
    task_id: int
    client_id: str
    issued_at: float
    deadline: float
    state: LeaseState = LeaseState.LEASED
    resolved_at: float | None = None
    #: who may answer it: the client's resume id, which outlives its connection id
    holder: str = ""
    #: the update codec its task message named (linkcodecs: the holder's link's)
    upload_codec: str | None = None

    @property
    def live(self) -> bool:
        return self.state is LeaseState.LEASED

    def move(self, to: LeaseState, now: float) -> None:
        self.state = checked_move(
            f"lease {self.lease_id}", LEASE_TRANSITIONS, self.state, to, LeaseError
        )
        self.resolved_at = now


def lease_seconds(
    *, compute_s: float, nbytes: int, bytes_per_s: float, min_s: float, slack: float
) -> float:
    """How long a lease lasts: ``slack`` times the predicted compute time plus
    the transfer of ``nbytes`` at ``bytes_per_s``, and at least ``min_s``."""
    predicted = compute_s + nbytes / min(bytes_per_s, 1e12)
    return max(min_s, slack * predicted)


def task_steps(
    *,
    flops_per_step: float,
    flops_per_s: float,
    transfer_bytes: float,
    bytes_per_s: float,
    rows: int,
    batch: int,
    task_seconds: float,
    transfer_ratio: float,
    max_epochs: float,
    tau_min: int,
    tau_max: int,
) -> int:
    """Local steps for one client's task under ``tau = "auto"``.

    Enough that the task computes for ``task_seconds`` and for ``transfer_ratio``
    times its transfer (``transfer_bytes`` at ``bytes_per_s``) at the client's
    rate: the coordinator's merge and the link are then a small part of every
    task, whatever the client's speed. At most ``max_epochs`` passes over the
    task's ``rows`` (more only memorises one shard), within ``tau_min..tau_max``.
    """
    transfer_s = transfer_bytes / max(bytes_per_s, 1e-9)
    seconds = max(task_seconds, transfer_ratio * transfer_s)
    steps = math.ceil(seconds * max(flops_per_s, 1.0) / max(flops_per_step, 1.0))
    if rows > 0:
        steps = min(steps, math.floor(max_epochs * rows / max(batch, 1)))
    return max(tau_min, min(tau_max, steps))


def task_work(steps: int, round_steps: int) -> float:
    """A task's share of a round on the progress clock (ModelState.progress):
    ``steps`` against the ``round_steps`` of a round's task (task_steps at
    ``round_seconds`` with no transfer), at most 1: a longer task (a slow link's)
    moves the model by one averaged delta all the same."""
    return min(1.0, steps / max(round_steps, 1))


class LeaseBook:
    """All tasks and leases of a job, with ids from counters (deterministic).

    Deadlines live in a heap (resolved leases leave it lazily), so finding the
    next or the due deadlines costs O(log n), not a scan of every live lease.
    Leases that resolve long before their deadline (clients that take a task and
    vanish) would pile up in it until then; when most of it is such, it is
    rebuilt from the live leases (amortized O(1) a lease).
    ``on_release(client_id)`` is called when a client's live lease resolves (the
    core keeps its set of idle clients with it).
    """

    __slots__ = (
        "_by_client",
        "_deadlines",
        "_next_lease",
        "_next_task",
        "_queued",
        "_unstamped",
        "leases",
        "on_release",
        "outcomes",
        "retain_s",
        "tasks",
    )

    def __init__(
        self, on_release: Callable[[str], None] | None = None, *, retain_s: float = 600.0
    ) -> None:
        if not retain_s >= 0:
            raise ValueError(f"retain_s: must be >= 0, got {retain_s!r}")
        #: unresolved tasks (OPEN) and their leases; resolved ones leave (``resolve_task``)
        self.tasks: dict[int, Task] = {}
        self.leases: dict[int, Lease] = {}
        #: accepted task id -> (ACCEPTED, when), oldest first, for ``retain_s``
        self.outcomes: OrderedDict[int, tuple[TaskState, float]] = OrderedDict()
        self.retain_s = retain_s
        #: remembered without a time (restored), with their age then
        self._unstamped: list[tuple[int, float]] = []
        self._by_client: dict[str, int] = {}  # current lease per client
        self._queued: dict[str, int] = {}  # prefetched lease behind it
        self._deadlines: list[tuple[float, int]] = []
        self._next_task = 1
        self._next_lease = 1
        self.on_release = on_release

    def new_task(
        self, plan: TaskPlan, *, version: int, now: float, rows: int | None = None
    ) -> Task:
        task = Task(
            task_id=self._next_task,
            kind=plan.kind,
            version=version,
            shard=plan.shard,
            seed=plan.seed,
            steps=plan.steps,
            batch=plan.batch,
            round=plan.round,
            created_at=now,
            rows=rows,
            block=plan.block,
            lr_scale=plan.lr_scale,
            work=plan.work,
        )
        self._next_task += 1
        self.tasks[task.task_id] = task
        return task

    def lease(
        self,
        task: Task,
        client_id: str,
        *,
        now: float,
        deadline: float,
        queued: bool = False,
        holder: str = "",
    ) -> Lease:
        """Lease ``task`` to a client with no live lease, or, ``queued``, behind the
        one live lease it has (a prefetch)."""
        if task.state is not TaskState.OPEN:
            raise LeaseError(f"task {task.task_id} is {task.state.value}, cannot lease it")
        if queued:
            if client_id not in self._by_client or client_id in self._queued:
                raise LeaseError(f"client {client_id!r}: a queued lease needs exactly one live")
        elif client_id in self._by_client:
            raise LeaseError(f"client {client_id!r} already holds a live lease")
        lease = Lease(
            lease_id=self._next_lease,
            task_id=task.task_id,
            client_id=client_id,
            issued_at=now,
            deadline=deadline,
            holder=holder,
        )
        self._next_lease += 1
        self.leases[lease.lease_id] = lease
        (self._queued if queued else self._by_client)[client_id] = lease.lease_id
        heap = self._deadlines
        heapq.heappush(heap, (deadline, lease.lease_id))
        if len(heap) > 2 * (len(self._by_client) + len(self._queued)) + 64:
            heap[:] = [(x.deadline, x.lease_id) for x in self.leases_live()]
            heapq.heapify(heap)
        task.leases.append(lease.lease_id)
        task.clients.append(client_id)
        task.orphaned_at = None
        return lease

    def live_leases(self, task: Task) -> list[Lease]:
        return [self.leases[i] for i in task.leases if self.leases[i].live]

    def live_lease_of(self, client_id: str) -> Lease | None:
        """The client's current lease (the one it computes, or will compute next)."""
        lease_id = self._by_client.get(client_id)
        return None if lease_id is None else self.leases[lease_id]

    def queued_lease_of(self, client_id: str) -> Lease | None:
        """The prefetched lease waiting behind the client's current one."""
        lease_id = self._queued.get(client_id)
        return None if lease_id is None else self.leases[lease_id]

    def end(self, lease: Lease, to: LeaseState, now: float) -> None:
        """Resolve a live lease (the only way leases leave LEASED)."""
        lease.move(to, now)
        client_id = lease.client_id
        if self._by_client.get(client_id) == lease.lease_id:
            queued = self._queued.pop(client_id, None)
            if queued is not None:
                self._by_client[client_id] = queued  # the prefetched task is next
                return
            del self._by_client[client_id]
            if self.on_release is not None:
                self.on_release(client_id)
        elif self._queued.get(client_id) == lease.lease_id:
            del self._queued[client_id]

    def due(self, now: float) -> list[Lease]:
        """Live leases whose deadline has passed, oldest first."""
        heap, due, leases = self._deadlines, [], self.leases
        while heap and heap[0][0] <= now:
            lease = leases.get(heapq.heappop(heap)[1])  # None: its task resolved
            if lease is not None and lease.live:
                due.append(lease)
        for lease in due:  # still live until the caller resolves them
            heapq.heappush(heap, (lease.deadline, lease.lease_id))
        return sorted(due, key=lambda x: x.lease_id)

    def next_deadline(self) -> float | None:
        """The earliest deadline of a live lease."""
        heap, leases = self._deadlines, self.leases
        while heap:
            lease = leases.get(heap[0][1])
            if lease is not None and lease.live:
                break
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def open_tasks(self) -> list[Task]:
        return [t for t in self.tasks.values() if t.state is TaskState.OPEN]

    def leases_live(self) -> list[Lease]:
        leases = self.leases
        return [leases[i] for i in (*self._by_client.values(), *self._queued.values())]

    @property
    def next_task_id(self) -> int:
        return self._next_task

    @next_task_id.setter
    def next_task_id(self, value: int) -> None:
        """Restored from a checkpoint so that old task ids are never reused."""
        if value < self._next_task:
            raise LeaseError(f"next task id {value} would reuse ids below {self._next_task}")
        self._next_task = value

    def all_resolved(self) -> bool:
        return not self._by_client

    def resolve_task(self, task: Task, to: TaskState, now: float) -> list[Lease]:
        """Move a task to ACCEPTED/DROPPED and cancel its other live leases; the task
        and its leases then leave the book, an ACCEPTED outcome stays (``outcome``)."""
        task.move(to)
        cancelled = self.live_leases(task)
        for lease in cancelled:
            self.end(lease, LeaseState.CANCELLED, now)
        del self.tasks[task.task_id]
        for lease_id in task.leases:
            del self.leases[lease_id]
        if to is TaskState.ACCEPTED:
            self.outcomes[task.task_id] = (to, now)
        return cancelled

    def outcome(self, task_id: int) -> TaskState | None:
        """OPEN, ACCEPTED (for ``retain_s``), or None: dropped, forgotten or never
        issued (``task_id < next_task_id`` tells the last apart)."""
        task = self.tasks.get(task_id)
        if task is not None:
            return task.state
        done = self.outcomes.get(task_id)
        return None if done is None else done[0]

    def accepted_ids(self) -> list[int]:
        """Accepted tasks still remembered, in the order they resolved."""
        return [t for t, (state, _) in self.outcomes.items() if state is TaskState.ACCEPTED]

    def accepted_ages(self, now: float) -> list[float]:
        """How long ago each of ``accepted_ids`` resolved (0 where unknown), so a
        checkpoint keeps their ages and a restart does not make them young again."""
        return [
            max(0.0, now - when) if math.isfinite(when) and math.isfinite(now) else 0.0
            for state, when in self.outcomes.values()
            if state is TaskState.ACCEPTED
        ]

    def remember_accepted(
        self, task_ids: Iterable[int], ages: Iterable[float] | None = None
    ) -> None:
        """Outcomes of an earlier run (a checkpoint), ``ages`` seconds old then; their
        ``retain_s`` counts from the next ``forget`` less their age (the book has no
        clock of its own)."""
        ages = list(ages) if ages is not None else None
        for i, t in enumerate(task_ids):
            if t not in self.outcomes:
                self.outcomes[t] = (TaskState.ACCEPTED, -math.inf)
                self._unstamped.append((t, ages[i] if ages is not None else 0.0))

    def forget(self, now: float) -> int:
        """Drop outcomes older than ``retain_s``; returns how many."""
        if self._unstamped:
            for t, age in self._unstamped:
                self.outcomes[t] = (TaskState.ACCEPTED, now - age)
            self._unstamped.clear()
        horizon, outcomes, n = now - self.retain_s, self.outcomes, 0
        while outcomes:
            first = next(iter(outcomes.values()))
            if first[1] > horizon:
                break
            outcomes.popitem(last=False)
            n += 1
        return n
