"""The strategy interface: which task a client gets now, and what a result does.

A strategy is pure scheduling and maths: no IO, no clock, randomness only from
the generator it is given. The core owns connections, leases and validation,
and calls the verbs below; a strategy owns the model's evolution.

Call-order contract (all calls from one thread, ``now`` never decreasing):

- ``task_for(client, now)`` when a client is idle; ``None`` means keep waiting.
- ``on_result(task, update, now)`` once per OPEN task, with an update that has
  already passed validation; it returns an :class:`Outcome`. If it is not
  accepted, the core acknowledges it with ``outcome.reason`` and drops the task.
- ``on_lease_lost(task, now)`` when a task's last live lease expired or its
  client left; return True to have the task leased again (sync rounds need
  their slot), False to leave it to the resume grace (async).
- ``on_tick(now)`` on every tick, for deadlines; may step the model.
- ``on_evaluation(loss)`` after each of the coordinator's held-out
  evaluations; ``lr_scale()`` when a new local task is leased (its lr is the
  job's times that); ``divergence`` hears of accepted and diverged tasks.

Every step the strategy takes is reported (``StepReport``) so the core can emit
events, count contributions and drop tasks whose round has closed.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import Counter, deque
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from coordinator.core.config import DataSection, StrategySection
from coordinator.core.leases import Task, TaskPlan
from coordinator.core.strategies.aggregate import schedule_factor, staleness_scale
from coordinator.core.strategies.divergence import DivergenceGuard
from coordinator.core.strategies.plateau import LrPlateau
from coordinator.core.strategies.robust import aggregate
from nn.changes import ChangedRows
from nn.params import Params
from nn.subnet import Subnet, covered_mean

#: how fast ``Strategy.concurrency`` follows each result's staleness + 1
CONCURRENCY_GAIN = 0.2


@dataclass(slots=True)
class ModelState:
    """The global model: params, its version, and how many results it merged;
    ``changed``: its rows moved since the service last took them (checkpoints);
    ``progress``: the clock of the lr plateau and the early stop, each version
    adding the mean share of a round's task (leases.task_work) of what it merged:
    the version itself while tasks are of a round's length.

    ``lock`` is held by every write to ``params`` together with its version step,
    so that a reader on another thread (a checkpoint taken while the model keeps
    training: coordinator/runtime/snapshots.py) copies a neuron group as of one version.
    The core has no threads: a driver that reads from another one sets a real
    lock. ``whole_steps`` counts the writes that were not in-place merges."""

    params: Params
    version: int = 0
    contributions: int = 0
    progress: float = 0.0
    changed: ChangedRows = field(init=False)
    lock: AbstractContextManager[Any] = field(default_factory=nullcontext, repr=False)
    whole_steps: int = 0

    def __post_init__(self) -> None:
        self.changed = ChangedRows(self.params.spec)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientView:
    """What a strategy may know about the client asking for work."""

    client_id: str
    version_held: int | None
    connected: int
    #: it fetches shards by hash (hello.data), and returns boundaries (hello.boundary)
    shards: bool = False
    boundary: bool = False
    #: shards of its latest tasks, newest first: it holds them (ClientRecord.shards_held)
    held: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class StepReport:
    """The model moved (or a round closed): ``merged`` results went in."""

    stepped: bool
    merged: int
    dropped: tuple[int, ...] = ()
    #: the step changed only this subnet's parameters (None: any of them), so an
    #: incremental checkpoint rewrites only its neuron groups; with ``update``, the
    #: step was exactly ``params += scale * within.expand(update)`` (a log entry)
    within: Subnet | None = None
    update: np.ndarray | None = None
    scale: float = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    accepted: bool
    staleness: int
    reason: str | None = None
    step: StepReport | None = None


class ShardCursor:
    """Hands out shard ids so every shard is visited once per cycle.

    Each cycle is a fresh seeded permutation of ``range(shards)``; a shard whose
    task was lost is put back at the front so it is not skipped. ``next(prefer)``
    takes the first of ``prefer`` still due in this cycle before the queue's head:
    a client is given a shard it holds whenever the cycle allows, so a volunteer
    on a slow link fetches a shard about once a cycle instead of once a task
    (docs/coordinator.md, "Strategies": shard affinity). ``lead`` > 1 lets a
    preference be met from the next ``lead - 1`` cycles too: a crowd of more
    clients than shards holds each shard several times over, and with one cycle
    only the first of a shard's holders to ask got it, the rest fetched another
    (700 roblox players on 64 shards spent half their downlink on shards).
    No shard is ever more than ``lead`` visits ahead of another.
    """

    __slots__ = ("_due", "_queue", "rng", "shards")

    def __init__(self, shards: int, rng: np.random.Generator) -> None:
        self.shards = shards
        self.rng = rng
        self._queue: deque[int] = deque()
        #: the queue's shards counted, so a preference is looked up without a scan
        self._due: Counter[int] = Counter()

    def next(self, prefer: tuple[int, ...] = (), lead: int = 1) -> int:
        if not self._queue:
            self._new_cycle()
        s = next((s for s in prefer if self._due[s]), None)
        while s is None and prefer and max(self._due.values()) < lead:
            self._new_cycle()  # a cycle ahead: some holder of these shards comes first
            s = next((s for s in prefer if self._due[s]), None)
        if s is None:
            s = self._queue.popleft()
        else:
            self._queue.remove(s)
        self._due[s] -= 1
        return s

    def _new_cycle(self) -> None:
        cycle = [int(s) for s in self.rng.permutation(self.shards)]
        self._queue.extend(cycle)
        self._due.update(cycle)

    def requeue(self, shard: int) -> None:
        self._queue.appendleft(shard)
        self._due[shard] += 1

    def state_dict(self) -> dict[str, Any]:
        return {"queue": list(self._queue)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._queue = deque(int(s) for s in state["queue"])
        self._due = Counter(self._queue)


class Strategy(ABC):
    """Base of the four scheduling methods; see the module docstring."""

    name: ClassVar[str]
    #: "gradient" (central) or "local" (decentral): what a task computes
    task_kind: ClassVar[str]
    #: a client may get its next task while it still computes one (a prefetch,
    #: docs/protocol.md §3.12): decentral-async only. A sync round has no next
    #: task until every result of this one is in; central-async's task is one
    #: gradient, which a prefetch would compute from a model a task older
    pipelined: ClassVar[bool] = False

    def __init__(
        self,
        *,
        model: ModelState,
        config: StrategySection,
        data: DataSection,
        rng: np.random.Generator,
    ) -> None:
        self.model = model
        self.config = config
        self.data = data
        self.rng = rng
        self.cursor = ShardCursor(data.shards, rng)
        #: the running mean of results' staleness + 1: the tasks in flight together
        self.concurrency = 1.0
        #: the tasks' lr multiplier from held-out plateaus (``on_evaluation``)
        self.plateau = LrPlateau(config.plateau_patience, config.plateau_factor, config.plateau_min)
        #: the cap on that multiplier from tasks that diverged (divergence.py)
        self.divergence = DivergenceGuard()
        #: ``config.schedule`` and its fields as keywords, dumped once (``step_scale``
        #: runs per result; the section is frozen, a new one is dumped again)
        self._schedule_of: Any = None
        self._schedule_kw: dict[str, Any] = {}

    # -- verbs ------------------------------------------------------------------

    @abstractmethod
    def task_for(self, client: ClientView, now: float) -> TaskPlan | None:
        """The task this client should do now, or None to keep it waiting."""

    @abstractmethod
    def on_result(self, task: Task, update: np.ndarray, now: float) -> Outcome:
        """Take a validated update (flat float32) for an OPEN task, in the layout of
        ``task.subnet`` when it is a sub-model task (``dense`` places it)."""

    def on_task_created(self, task: Task) -> None:
        """The core made a Task from this strategy's plan (sync rounds track theirs)."""
        return None

    def on_lease_lost(self, task: Task, now: float) -> bool:
        """Default (async): revisit the shard with a new task; keep this one for resume."""
        self.cursor.requeue(task.shard)
        return False

    def on_tick(self, now: float) -> StepReport | None:
        return None

    def pending(self) -> int:
        """Accepted results not yet merged into the model (buffers, open rounds)."""
        return 0

    def round_outer_lr(self) -> float | None:
        """The outer lr of the last round (decentral-sync); None where there is none."""
        return None

    def averaged_with(self) -> int:
        """How many results, at least, a result of a task issued now is averaged with
        before it moves the model (1: merged on its own). Its rounding noise shrinks
        with that count, which is what lets linkcodecs ask for fewer bits."""
        return 1

    def next_deadline(self) -> float | None:
        """When ``on_tick`` next has something to do (a round's deadline); None: never
        by itself. The core's ``next_wakeup`` takes the minimum of every timer owner's."""
        return None

    # -- helpers ----------------------------------------------------------------

    def new_plan(
        self,
        client: ClientView | None = None,
        *,
        round: int | None = None,
        shard: int | None = None,
    ) -> TaskPlan:
        """A task plan on ``shard``; without one, for ``client``, on a shard it holds
        when one is due."""
        steps = self.config.nominal_tau if self.task_kind == "local" else 1
        if shard is None:
            held, lead = (), 1
            if client is not None:  # a crowd of N holds each of S shards about N/S times
                held, lead = client.held, max(1, -(-client.connected // self.cursor.shards))
            shard = self.cursor.next(held, lead)
        return TaskPlan(
            kind=self.task_kind,
            shard=shard,
            seed=int(self.rng.integers(0, 2**31 - 1)),
            steps=steps,
            batch=self.data.batch,
            round=round,
        )

    def combine(
        self,
        updates: list[np.ndarray],
        weights: list[float] | None = None,
        subnets: Sequence[Subnet | None] = (),
    ) -> np.ndarray:
        """A round's or a buffer's updates as one, by ``config.aggregator`` (robust.py);
        ``weights`` (``sample_weight`` of each result's task) weight the ``mean``.
        Sub-model results (``subnets``, the job refuses other aggregators for them)
        average per coordinate over the results that hold it."""
        c = self.config
        if any(s is not None for s in subnets):
            return covered_mean(updates, weights or [1.0] * len(updates), subnets)
        return aggregate(c.aggregator, updates, weights, byzantine_fraction=c.byzantine_fraction)

    @staticmethod
    def dense(task: Task, update: np.ndarray) -> np.ndarray:
        """The update in the whole model's layout (a sub-model task's, placed)."""
        return update if task.subnet is None else task.subnet.expand(update)

    @staticmethod
    def sample_weight(task: Task) -> float:
        """A result's weight in a mean: its task's rows (FedAvg weights each client
        by its sample count), 1 when unknown. The coordinator knows the rows of the
        shard it leased; a count the client claims is never used."""
        return float(task.rows) if task.rows else 1.0

    @property
    def merges_in_place(self) -> bool:
        """Whether each sub-model result is merged alone, in place, as it arrives
        (then a driver may log results instead of checkpointing the model)."""
        return False

    def scale(self, staleness: int) -> float:
        st = self.config.staleness
        return staleness_scale(staleness, kind=st.kind, a=st.a, b=st.b)

    def observe_concurrency(self, staleness: int) -> float:
        """Fold a result's ``staleness + 1`` (the tasks in flight beside it) into the
        running concurrency K and return K (at least 1)."""
        self.concurrency += CONCURRENCY_GAIN * (staleness + 1 - self.concurrency)
        return max(1.0, self.concurrency)

    def on_evaluation(self, loss: float) -> None:
        """The coordinator's held-out loss: without a new best for
        ``plateau_patience`` evaluations, and for as many rounds (K tasks of
        ``round_seconds`` each on the progress clock, K the concurrency: a big
        crowd makes versions fast and evaluations close, short tasks make them
        small), the tasks' lr is cut by ``plateau_factor`` (not below
        ``plateau_min``): the reduce-on-plateau of one-machine training, on the
        one signal no client can fake."""
        self.plateau.observe(loss, self.model.progress, max(1.0, self.concurrency))

    @property
    def lr_decay(self) -> float:
        """The tasks' lr multiplier from held-out plateaus."""
        return self.plateau.decay

    def lr_scale(self, steps: int | None = None) -> float:
        """The next local task's lr multiplier: for decentral-async (``lr_scaling``)
        K or sqrt(K), up to ``lr_scale_max``, where K deltas are merged at about
        1/K each and their noise averages out ("auto": for SGD tasks K up to
        ``lr_scale_max``, or sqrt(K) up to ``lr_scale_crowd_max`` where that is
        more, and for a task of ``steps`` local steps at most ``max_scaled_steps /
        steps``, not below 1; 1 for momentum and Adam ones), times the plateau
        decay; for every local task, at most the cap from diverged tasks
        (divergence.py); 1 for gradient tasks, which take no step of their own."""
        c = self.config
        if self.task_kind != "local":
            return 1.0
        cap = self.divergence.cap
        if self.name != "decentral-async":
            return min(1.0, cap)
        rule = c.lr_scaling
        if rule == "auto" and c.client_optimizer != "sgd":
            rule = "none"
        if rule == "none":
            return min(cap, self.lr_decay)
        k = max(1.0, self.concurrency)
        if rule == "auto":  # linear, then sqrt once the crowd outgrows it
            scaled = max(min(k, c.lr_scale_max), min(math.sqrt(k), c.lr_scale_crowd_max))
            if steps:  # a long task's delta is a trajectory, not a big batch's step
                scaled = min(scaled, max(1.0, c.max_scaled_steps / steps))
        else:
            scaled = min(c.lr_scale_max, k if rule == "linear" else math.sqrt(k))
        return min(cap, self.lr_decay * scaled)

    def step_scale(self) -> float:
        """The schedule's multiplier on the step taken now (at the model's version)."""
        sched = self.config.schedule
        if self._schedule_of is not sched:
            self._schedule_of, self._schedule_kw = sched, sched.model_dump()
        return schedule_factor(self.model.version, **self._schedule_kw)

    def staleness_of(self, task: Task) -> int:
        return self.model.version - task.version

    def too_stale(self, staleness: int) -> bool:
        bound = self.config.max_staleness
        return bound is not None and staleness > bound

    def step_version(
        self,
        merged: int,
        *,
        within: Subnet | None = None,
        update: np.ndarray | None = None,
        scale: float = 1.0,
        work: float = 1.0,
    ) -> StepReport:
        """The next version, of ``merged`` results whose mean share of a round's
        task is ``work`` (the progress clock)."""
        self.model.version += 1
        self.model.progress += work
        self.model.contributions += merged
        return StepReport(stepped=True, merged=merged, within=within, update=update, scale=scale)

    # -- checkpoints ------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        p = self.plateau
        return {
            "rng": self.rng.bit_generator.state,
            "cursor": self.cursor.state_dict(),
            "concurrency": self.concurrency,
            "lr_decay": p.decay,
            "best_loss": None if p.best == math.inf else p.best,
            "since_best": p.since_best,
            "best_progress": p.best_at,
            "divergence": self.divergence.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.cursor.load_state_dict(state["cursor"])
        # (checkpoints before these were kept: a fresh start for each)
        self.concurrency = float(state.get("concurrency", 1.0))
        p = self.plateau
        p.decay = float(state.get("lr_decay", 1.0))
        best = state.get("best_loss")
        p.best = math.inf if best is None else float(best)
        p.since_best = int(state.get("since_best", 0))
        # (a checkpoint of before the progress clock kept the best's version)
        p.best_at = float(state.get("best_progress", state.get("best_version", 0)))
        self.divergence.load_state_dict(state.get("divergence"))
