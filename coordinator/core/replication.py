"""Adaptive replication: verified results, as BOINC does (issue 17).

When the core leases a new task (the *primary*), this module decides with the holder's rate
whether to replicate it: then it keeps a snapshot of that model version and offers a *twin*
(same version, shard, seed, steps and batch, its own task id) to the next idle client other
than the holder whose §12 kernel family (``hello.kernel``) is the holder's; when the
holder's is unknown, or the unit has waited ``twin_wait_s`` since its primary was leased,
to any other (``may_take``). The two copies form a *unit*::

    WAITING  -> RUNNING | UNCHECKED | CANCELLED   twin leased / primary in first / lost
    RUNNING  -> HELD | UNCHECKED | CANCELLED      a result in / the other copy gone / lost
    HELD     -> AGREED | DISAGREED | UNCHECKED    the other result in / the other lost
              | RUNNING                           the held copy's client was excluded

A unit CANCELLED before any result leaves its primary an ordinary task (applied unchecked if
it comes); a lost primary takes its twin with it (dropped). The first result of a unit is held
(acknowledged, and saved by ``state_dict``) until the other arrives; only then does one of them
reach the strategy. A disagreement is judged by the coordinator's own run of the task
(``client.compute.run_task``, from the snapshot) with what can prove it (judging.py: a copy
proven wrong, or *inconclusive*); ``strikes`` proven wrong among a client's last
``strike_window`` checked results exclude it, and its updates are accounted for. Agreement,
trust, rates, exclusion, costs, limits: docs/coordinator.md ("Adaptive replication").
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from client.compute import run_task
from coordinator.core import events as ev
from coordinator.core.config import ReplicationSection
from coordinator.core.judging import Verdict, agree, family, judge, may_take, shift_check
from coordinator.core.leases import LeaseBook, Task, TaskPlan, TaskState
from coordinator.core.registry import ClientRecord, Registry
from coordinator.core.strategies.base import ModelState, Outcome
from nn.data import Dataset
from nn.params import Params
from protocol import messages as m
from protocol.states import checked_move


class UnitState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    HELD = "held"
    AGREED = "agreed"
    DISAGREED = "disagreed"
    UNCHECKED = "unchecked"
    CANCELLED = "cancelled"


UNIT_TRANSITIONS: dict[UnitState, frozenset[UnitState]] = {
    UnitState.WAITING: frozenset({UnitState.RUNNING, UnitState.UNCHECKED, UnitState.CANCELLED}),
    UnitState.RUNNING: frozenset({UnitState.HELD, UnitState.UNCHECKED, UnitState.CANCELLED}),
    UnitState.HELD: frozenset(
        {UnitState.AGREED, UnitState.DISAGREED, UnitState.UNCHECKED, UnitState.RUNNING}
    ),
    UnitState.AGREED: frozenset(),
    UnitState.DISAGREED: frozenset(),
    UnitState.UNCHECKED: frozenset(),
    UnitState.CANCELLED: frozenset(),
}


@dataclass(slots=True, kw_only=True, eq=False)
class Copy:
    """One copy's validated result (raw: clipping is applied when it goes in)."""

    task_id: int
    holder: str  # resume id
    client_id: str
    update: np.ndarray
    norm: float
    kernel: str = ""  # its holder's kernel family when it came in (``family``)


@dataclass(slots=True, kw_only=True)
class Unit:
    """A replicated task: its primary (the strategy's), its twin once leased, and
    the first result in while the other is awaited."""

    primary: Task
    holder: str  # the primary's holder (resume id)
    kernel: str = ""  # the primary holder's kernel family (``family``) when leased
    twin_id: int | None = None
    state: UnitState = UnitState.WAITING
    held: Copy | None = None

    def move(self, to: UnitState) -> None:
        self.state = checked_move(
            f"unit {self.primary.task_id}", UNIT_TRANSITIONS, self.state, to, RuntimeError
        )


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Release:
    """An update to hand to the strategy now, as the result of ``task`` (a primary);
    ``checked``: it agreed with another copy or with the coordinator's own."""

    task: Task
    update: np.ndarray
    norm: float
    holder: str
    checked: bool


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Exclusion:
    """A client caught disagreeing: subtract ``revert`` from the model, emit
    ``event``, and close the client if ``close`` (it is connected now)."""

    event: ev.ClientExcluded
    close: bool
    revert: np.ndarray | None


@dataclass(slots=True)
class ReplicationStats:
    units: int = 0  # tasks chosen for replication
    skipped: int = 0  # chosen, but no memory for the snapshot
    twins: int = 0  # twins leased
    agreed: int = 0
    disagreed: int = 0
    unchecked: int = 0  # a unit's result went in without a comparison
    cancelled: int = 0
    excluded: int = 0
    #: copies of a disagreeing pair the own run could not judge (``Verdict.INCONCLUSIVE``)
    inconclusive: int = 0
    #: twins taken by a client of another kernel family than the primary's holder
    cross_kernel: int = 0
    #: disagreements counted against a client short of its exclusion
    struck: int = 0
    reverted: int = 0  # unchecked updates subtracted from the model
    recomputes: int = 0  # tasks the coordinator computed to settle a disagreement
    steps: int = 0  # optimizer steps of every result taken, twins included
    replica_steps: int = 0  # of which twins'


class Replicator:
    """The core's replication book; see the module docstring for the rules.

    Call-order contract (the core's): ``twin_for`` then, if it leased a task,
    ``leased`` for every task it leases; ``arrived`` for a copy's valid result
    (after the core took it in the book), ``copy_lost`` when a task's last live
    lease ended without a result; ``delivered`` for every result taken. What the
    core must then do (apply, exclude, emit) is queued in ``ready``, in order.
    """

    def __init__(
        self,
        config: ReplicationSection,
        *,
        model: ModelState,
        book: LeaseBook,
        registry: Registry,
        rng: np.random.Generator,
        describe: Callable[[Task], m.Task],
        dataset: Dataset,
        journal: bool,
    ) -> None:
        self.config = config
        self.enabled = config.enabled
        self.model = model
        self.book = book
        self.registry = registry
        self.rng = rng
        self.describe = describe
        self.dataset = dataset
        self.stats = ReplicationStats()
        self.ready: deque[Release | Exclusion | ev.ResultVerified] = deque()
        self._rtol = config.slack * config.rtol
        self._atol = config.slack * config.atol
        self._units: dict[int, Unit] = {}  # by primary and twin task id
        self._waiting: deque[Unit] = deque()
        self._offered: tuple[TaskPlan, Unit] | None = None
        self._snapshots: dict[int, list[Any]] = {}  # version -> [params, units using it]
        self._max_snapshots = max(1, int(config.snapshot_mib * 2**20 // model.params.data.nbytes))
        #: recent unchecked steps: (holder, contribution); only where one result is one
        #: additive step (``journal``), within ``revert_mib``
        self._journal: deque[tuple[str, np.ndarray]] = deque()
        self._max_journal = (
            int(config.revert_mib * 2**20 // model.params.data.nbytes) if journal else 0
        )

    # -- the core's calls ----------------------------------------------------------

    def rate(self, trust: int) -> float:
        """Probability that a task of a client with this trust is replicated."""
        c = self.config
        if trust < c.trust_after:
            return c.base_rate
        return max(c.min_rate, min(c.base_rate, 1.0 / trust))

    def twin_for(self, rec: ClientRecord, now: float) -> TaskPlan | None:
        """A twin this client may compute (never its own task's, and one of its kernel
        family's or one that waited ``twin_wait_s``: ``may_take``), oldest first."""
        waiting = self._waiting
        while waiting and waiting[0].state is not UnitState.WAITING:
            waiting.popleft()
        holder, kernel, wait = rec.resume_id, family(rec.kernel), self.config.twin_wait_s
        for unit in waiting:
            if (
                unit.state is UnitState.WAITING
                and unit.holder != holder
                and may_take(unit.kernel, kernel, now - unit.primary.created_at, wait)
            ):
                p = unit.primary
                plan = TaskPlan(
                    kind=p.kind, shard=p.shard, seed=p.seed, steps=p.steps, batch=p.batch,
                    version=p.version, lr_scale=p.lr_scale,
                )  # fmt: skip
                self._offered = (plan, unit)
                return plan
        return None

    def leased(self, task: Task, plan: TaskPlan, rec: ClientRecord, connected: int) -> bool:
        """The core leased ``task``; returns whether it is a twin."""
        offered, self._offered = self._offered, None
        if offered is not None and offered[0] is plan:
            unit = offered[1]
            unit.move(UnitState.RUNNING)
            unit.twin_id = task.task_id
            self._units[task.task_id] = unit
            self.stats.twins += 1
            self.stats.cross_kernel += unit.kernel != family(rec.kernel)
            return True
        if not self.enabled or plan.reissue is not None or connected < 2:
            return False
        if self.rng.random() >= self.rate(rec.trust):
            return False
        if not self._keep(task.version):
            self.stats.skipped += 1
            return False
        unit = Unit(primary=task, holder=rec.resume_id, kernel=family(rec.kernel))
        self._units[task.task_id] = unit
        self._waiting.append(unit)
        self.stats.units += 1
        return False

    def unit_of(self, task_id: int) -> Unit | None:
        return self._units.get(task_id)

    def is_twin(self, task_id: int) -> bool:
        unit = self._units.get(task_id)
        return unit is not None and unit.twin_id == task_id

    def snapshot(self, version: int) -> np.ndarray:
        """The parameters of a version kept for its twins (flat float32)."""
        return self._snapshots[version][0]

    def delivered(self, task: Task) -> None:
        """A result was taken (acknowledged as accepted): count its compute."""
        self.stats.steps += task.steps
        if self.is_twin(task.task_id):
            self.stats.replica_steps += task.steps

    def arrived(
        self, unit: Unit, task: Task, rec: ClientRecord, update: np.ndarray, norm: float, now: float
    ) -> None:
        """A copy's valid result, already taken in the book: hold it, compare it, or
        let it go in unchecked."""
        copy = Copy(
            task_id=task.task_id, holder=rec.resume_id, client_id=rec.client_id,
            update=update, norm=norm, kernel=family(rec.kernel),
        )  # fmt: skip
        if unit.state is UnitState.HELD:
            self._compare(unit, copy, now)
            return
        other = unit.primary.task_id if task.task_id == unit.twin_id else unit.twin_id
        t = self.book.tasks.get(other) if other is not None else None
        if t is not None and t.state is TaskState.OPEN and self.book.live_leases(t):
            unit.move(UnitState.HELD)
            unit.held = copy
            return
        self._unchecked(unit, copy, now)

    def copy_lost(self, task: Task, now: float) -> bool:
        """A copy's last live lease ended without a result. True: the core is done
        with the task (a twin, dropped here; or a primary whose twin's result went
        in for it); False: it goes on as an ordinary lost task."""
        unit = self._units.get(task.task_id)
        if unit is None:
            return False
        twin = task.task_id == unit.twin_id
        if unit.state is UnitState.HELD:
            held = unit.held
            assert held is not None
            self._unchecked(unit, held, now)
        else:  # nothing in yet
            unit.move(UnitState.CANCELLED)
            self.stats.cancelled += 1
            self._end(unit)
            other = self.book.tasks.get(unit.twin_id) if not twin and unit.twin_id else None
            if other is not None and other.state is TaskState.OPEN:
                self.book.resolve_task(other, TaskState.DROPPED, now)
        if twin and task.state is TaskState.OPEN:
            self.book.resolve_task(task, TaskState.DROPPED, now)
        return twin or task.state is not TaskState.OPEN

    def applied(self, holder: str, before: np.ndarray | None, outcome: Outcome) -> None:
        """An unchecked result went in: count it against its holder (and for its
        trust, once trusted), and journal its step (``before``: the params before)."""
        if not self.enabled:
            return
        rec = self.registry.lookup(holder)
        if rec is not None:
            rec.unverified += 1
            if rec.trust >= self.config.trust_after:
                rec.trust += 1  # BOINC: a trusted host's unreplicated result counts as valid
        step = outcome.step
        if before is None or step is None or step.merged != 1 or not self._max_journal:
            return
        self._journal.append((holder, self.model.params.data - before))
        while len(self._journal) > self._max_journal:
            self._journal.popleft()

    @property
    def journals(self) -> bool:
        """The core should pass the params before an unchecked step to ``applied``."""
        return self.enabled and self._max_journal > 0

    def refuses(self, resume_id: str | None) -> bool:
        """A hello resuming an excluded client's session."""
        if not resume_id:
            return False
        rec = self.registry.lookup(resume_id)
        return rec is not None and rec.excluded

    def summary(self) -> dict[str, Any]:
        """Counters for status pages and reports; ``overhead`` is replica steps over all."""
        s = asdict(self.stats)
        s["overhead"] = round(self.stats.replica_steps / self.stats.steps, 4) if s["steps"] else 0.0
        return s

    # -- checkpoints ---------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Results held (acknowledged, not yet in the model) and the counters."""
        held = [
            (u.primary, u.held.update, u.held.norm) for u in self._distinct() if u.held is not None
        ]
        held += [(r.task, r.update, r.norm) for r in self.ready if isinstance(r, Release)]
        return {
            "held": [
                {
                    "task": [t.task_id, t.kind, t.version, t.shard, t.seed, t.steps, t.batch],
                    "update": update.copy(),
                    "norm": norm,
                }
                for t, update, norm in held
            ],
            "stats": asdict(self.stats),
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Results held at the checkpoint go in unchecked at the core's next call:
        their twins' leases did not survive the restart."""
        for h in state["held"]:
            tid, kind, version, shard, seed, steps, batch = h["task"]
            task = Task(
                task_id=int(tid), kind=str(kind), version=int(version), shard=int(shard),
                seed=int(seed), steps=int(steps), batch=int(batch), round=None, created_at=0.0,
            )  # fmt: skip
            update = np.asarray(h["update"], dtype=np.float32)
            self.ready.append(
                Release(task=task, update=update, norm=float(h["norm"]), holder="", checked=False)
            )
        self.stats = ReplicationStats(**state["stats"])
        self.rng.bit_generator.state = state["rng"]

    # -- inside --------------------------------------------------------------------

    def _distinct(self) -> list[Unit]:
        seen: dict[int, Unit] = {}
        for u in self._units.values():
            seen.setdefault(u.primary.task_id, u)
        return list(seen.values())

    def _keep(self, version: int) -> bool:
        snap = self._snapshots.get(version)
        if snap is not None:
            snap[1] += 1
            return True
        if len(self._snapshots) >= self._max_snapshots:
            return False
        self._snapshots[version] = [self.model.params.data.copy(), 1]
        return True

    def _end(self, unit: Unit) -> None:
        """The unit is over: forget it and let go of its snapshot."""
        self._units.pop(unit.primary.task_id, None)
        if unit.twin_id is not None:
            self._units.pop(unit.twin_id, None)
        unit.held = None
        snap = self._snapshots.get(unit.primary.version)
        if snap is not None:
            snap[1] -= 1
            if snap[1] <= 0:
                del self._snapshots[unit.primary.version]

    def _unchecked(self, unit: Unit, copy: Copy, now: float) -> None:
        """``copy`` goes in alone; the primary, still open (its holder lost it, the
        twin's result stands for it), is taken so that a late copy is a duplicate."""
        unit.move(UnitState.UNCHECKED)
        self.stats.unchecked += 1
        primary = self.book.tasks.get(unit.primary.task_id)
        if primary is not None and primary.state is TaskState.OPEN:
            self.book.resolve_task(primary, TaskState.ACCEPTED, now)
        self.ready.append(
            Release(task=unit.primary, update=copy.update, norm=copy.norm, holder=copy.holder,
                    checked=False)
        )  # fmt: skip
        self._end(unit)

    def _compare(self, unit: Unit, second: Copy, now: float) -> None:
        first = unit.held
        assert first is not None
        a, b = (first, second) if first.task_id == unit.primary.task_id else (second, first)
        p = unit.primary
        tol = {"rtol": self._rtol, "atol": self._atol, "distance": self.config.distance}
        if agree(a.update, b.update, **tol):
            unit.move(UnitState.AGREED)
            self.stats.agreed += 1
            self._trusted(a.holder)
            self._passed(a.holder, b.holder)
            self.ready.append(self._verified(unit, a, b, (), now))
            self.ready.append(
                Release(task=p, update=a.update, norm=a.norm, holder=a.holder, checked=True)
            )
            self._end(unit)
            return
        unit.move(UnitState.DISAGREED)
        self.stats.disagreed += 1
        self.stats.recomputes += 1
        base = Params.from_flat(self.model.params.spec, self.snapshot(p.version))
        own = run_task(self.describe(p), base, self.dataset).update
        verdicts = judge(a.update, b.update, own, kernels=(a.kernel, b.kernel), **tol)
        self._end(unit)
        judged = tuple(zip((a, b), verdicts, strict=True))
        losers = tuple(c for c, v in judged if v is Verdict.WRONG)
        unsure = tuple(c for c, v in judged if v is Verdict.INCONCLUSIVE)
        self.stats.inconclusive += len(unsure)
        self.ready.append(self._verified(unit, a, b, losers, now, unsure))
        if verdicts[0] is Verdict.RIGHT:
            self._trusted(a.holder)
        self._passed(*(c.holder for c, v in judged if v is Verdict.RIGHT))
        for loser in losers:
            self._struck(loser, now)
        right = [c for c, v in judged if v is Verdict.RIGHT]
        if right:
            w = right[0]
            rel = Release(task=p, update=w.update, norm=w.norm, holder=w.holder, checked=True)
        else:  # neither: the coordinator's own result stands for the task
            norm = float(np.sqrt(own.astype(np.float64) @ own.astype(np.float64)))
            rel = Release(task=p, update=own, norm=norm, holder="", checked=True)
        self.ready.append(rel)

    def _verified(
        self,
        unit: Unit,
        a: Copy,
        b: Copy,
        losers: tuple[Copy, ...],
        now: float,
        inconclusive: tuple[Copy, ...] = (),
    ) -> ev.ResultVerified:
        return ev.ResultVerified(
            task_id=unit.primary.task_id,
            twin_id=b.task_id,
            client_ids=(a.client_id, b.client_id),
            agreed=unit.state is UnitState.AGREED,
            now=now,
            losers=tuple(c.client_id for c in losers),
            inconclusive=tuple(c.client_id for c in inconclusive),
        )

    def _trusted(self, holder: str) -> None:
        rec = self.registry.lookup(holder)
        if rec is not None:
            rec.trust += 1

    def _checked(self, rec: ClientRecord, struck: bool) -> int:
        """Shift one checked result into the holder's window; its strikes in it."""
        rec.recent_checks = shift_check(rec.recent_checks, struck, self.config.strike_window)
        return rec.recent_checks.bit_count()

    def _passed(self, *holders: str) -> None:
        for holder in holders:
            rec = self.registry.lookup(holder)
            if rec is not None:
                self._checked(rec, False)

    def _struck(self, loser: Copy, now: float) -> None:
        """A copy the coordinator's own run disproved (``Verdict.WRONG``): its result
        is not used and its holder's trust is 0; ``strikes`` of them among its last
        ``strike_window`` checked results exclude it: a rare rounding accident the
        rule cannot tell from a lie costs an honest client one result, a liar is
        struck on every checked one (benchmarks/replicas.py)."""
        rec = self.registry.lookup(loser.holder)
        if rec is not None:
            rec.strikes += 1
            rec.trust = 0
            if self._checked(rec, True) < self.config.strikes:
                self.stats.struck += 1
                return
        self._exclude(loser, now)

    def _exclude(self, loser: Copy, now: float) -> None:
        rec = self.registry.lookup(loser.holder)
        unverified = 0
        if rec is not None:
            rec.trust = 0
            unverified, rec.unverified = rec.unverified, 0
            rec.excluded = self.config.exclude
        if not self.config.exclude:
            return
        self.stats.excluded += 1
        # Its results held in other units never go in; their other copies then
        # go in unchecked when they arrive (the discarded copy's task is taken).
        for unit in self._distinct():
            if unit.state is UnitState.HELD and unit.held and unit.held.holder == loser.holder:
                unit.move(UnitState.RUNNING)
                unit.held = None
        mine = [c for h, c in self._journal if h == loser.holder]
        self._journal = deque((h, c) for h, c in self._journal if h != loser.holder)
        revert = None
        if mine:
            revert = np.sum(mine, axis=0, dtype=np.float32)
            self.stats.reverted += len(mine)
        close = rec is not None and rec.connected
        event = ev.ClientExcluded(
            client_id=rec.client_id if rec is not None and close else loser.client_id,
            task_id=loser.task_id, unverified=unverified, reverted=len(mine), now=now,
        )  # fmt: skip
        self.ready.append(Exclusion(event=event, close=close, revert=revert))
