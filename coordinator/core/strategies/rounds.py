"""Synchronous rounds, shared by central-sync and decentral-sync.

Theory of operation. The first idle client that asks for work opens a round of
``target`` slots (``clients_per_round``, or the clients connected when it opens,
grown by clients that connect while it has no result yet); each slot is one task
at the round's version (a round with a slot per shard keeps each holder on a
shard it holds). The round closes, combining its results into one outer step (a
``mean`` weighs each shard by its rows, split among the tasks that visited it:
FedAvg, stratified by shard), when

- every slot has a result, or
- the round deadline passes and at least ``ceil(quorum × target)`` slots have
  results (other tasks are dropped: late results are stale); ``quorum_grace`` g:
  a quorum reached t s after opening moves the deadline to t (1 + g) if sooner.

If the deadline passes below quorum, the round's unfinished tasks are leased
again to whoever is idle (replication, BOINC-style: the first result wins) and
the deadline is extended, so a straggler is never waited on forever. A task
whose lease is lost is leased again at once.

Phases: IDLE --task_for--> COLLECTING --all slots done | deadline with quorum--> IDLE.
"""

from __future__ import annotations

import bisect
import enum
import logging
import math
from abc import abstractmethod
from collections import Counter, deque
from typing import Any

import numpy as np

from coordinator.core.config import DataSection, StrategySection
from coordinator.core.leases import Task, TaskPlan, TaskState
from coordinator.core.strategies.aggregate import OuterLrScale, OuterOptimizer
from coordinator.core.strategies.base import ClientView, ModelState, Outcome, StepReport, Strategy
from nn.subnet import Subnet
from protocol.states import checked_move

logger = logging.getLogger(__name__)


class RoundPhase(enum.Enum):
    IDLE = "idle"
    COLLECTING = "collecting"


ROUND_TRANSITIONS: dict[RoundPhase, frozenset[RoundPhase]] = {
    RoundPhase.IDLE: frozenset({RoundPhase.COLLECTING}),
    RoundPhase.COLLECTING: frozenset({RoundPhase.IDLE}),
}


def fewest_averaged(config: StrategySection, target: int) -> int:
    """The fewest results a round of ``target`` slots averages (its quorum of them);
    1 under a robust aggregator: a median or a trim keeps rounding, not its mean."""
    if config.aggregator != "mean":
        return 1
    return max(1, math.ceil(config.quorum * target))


class RoundStrategy(Strategy):
    """Round bookkeeping; subclasses say how results combine into a direction."""

    def __init__(
        self,
        *,
        outer: OuterOptimizer,
        model: ModelState,
        config: StrategySection,
        data: DataSection,
        rng: np.random.Generator,
        auto_outer: OuterLrScale | None = None,
    ) -> None:
        super().__init__(model=model, config=config, data=data, rng=rng)
        self.outer = outer
        #: sizes each round's outer lr (outer_lr "auto"); None: the optimizer's lr
        self.auto_outer = auto_outer
        #: the outer lr of the last round, where a strategy reports one
        self.last_outer_lr: float | None = None
        self.phase = RoundPhase.IDLE
        self.round = 0
        self.target = 0
        self.planned = 0
        self.deadline: float | None = None
        #: when the round opened (or, after a restore, was first asked for work)
        self.opened_at = 0.0
        self.results: dict[int, np.ndarray] = {}
        #: each result's ``sample_weight``, by task id
        self.weights: dict[int, float] = {}
        self.round_tasks: dict[int, Task] = {}
        self.reissue: deque[Task] = deque()
        #: sub-model results' subnets, by task id (absent: the whole model)
        self.subnets: dict[int, Subnet] = {}
        #: this round's tasks planned per shard
        self.visits: Counter[int] = Counter()
        #: the shards this round has not visited, ascending, kept once its last
        #: slots must go to them (None before)
        self.unvisited: list[int] | None = None

    @abstractmethod
    def direction(
        self, updates: list[np.ndarray], weights: list[float], subnets: list[Subnet | None]
    ) -> np.ndarray:
        """The way to move the params given the round's updates, their sample
        weights and subnets (in task-id order)."""

    def coverage(self, tasks: list[Task]) -> float:
        """The expected share of the job's rows that a round's ``tasks`` sampled:
        per shard, ``1 - Π (1 - min(1, steps × batch / rows))`` of its rows (each
        task's own seed), over the job's shards taken as equal (0 where a task's
        rows are unknown: its spread counts as noise)."""
        missed: dict[int, float] = {}
        rows: dict[int, int] = {}
        for t in tasks:
            if not t.rows:
                continue
            seen = min(1.0, t.steps * t.batch / t.rows)
            missed[t.shard] = missed.get(t.shard, 1.0) * (1.0 - seen)
            rows[t.shard] = t.rows
        if not rows:
            return 0.0
        per_shard = sum(rows.values()) / len(rows)
        covered = sum(rows[s] * (1.0 - missed[s]) for s in rows)
        return min(1.0, covered / (per_shard * max(self.data.shards, len(rows))))

    def _move(self, to: RoundPhase) -> None:
        self.phase = checked_move(
            f"round {self.round}", ROUND_TRANSITIONS, self.phase, to, RuntimeError
        )

    def _open(self, client: ClientView, now: float) -> None:
        self._move(RoundPhase.COLLECTING)
        self.round += 1
        self.target = self.config.clients_per_round or max(1, client.connected)
        self.planned = 0
        self.deadline = now + self.config.round_deadline_s
        self.opened_at = now
        self.results = {}
        self.weights = {}
        self.subnets = {}
        self.round_tasks = {}
        self.reissue.clear()
        self.visits.clear()
        self.unvisited = None

    def task_for(self, client: ClientView, now: float) -> TaskPlan | None:
        if self.phase is RoundPhase.IDLE:
            self._open(client, now)
        if self.deadline is None:  # restored from a checkpoint mid-round
            self.deadline = now + self.config.round_deadline_s
            self.opened_at = now
        for t in [t for t in self.reissue if t.state is not TaskState.OPEN]:
            self.reissue.remove(t)
        for t in self.reissue:
            if client.client_id not in t.clients:  # never back to a client that had it
                self.reissue.remove(t)
                return TaskPlan(
                    kind=t.kind,
                    shard=t.shard,
                    seed=t.seed,
                    steps=t.steps,
                    batch=t.batch,
                    round=t.round,
                    reissue=t.task_id,
                )
        if (
            self.planned >= self.target
            and self.config.clients_per_round is None
            and not self.results
            and client.connected > self.target
        ):
            # A client that connected after the round opened joins it while no
            # result is in yet: otherwise, with players arriving one by one,
            # round 1 has one slot and everyone else sits it out (and then holds
            # no version, so its next download is the whole model).
            self.target = client.connected
        if self.planned < self.target:
            plan = self.new_plan(client, round=self.round, shard=self._shard_for(client))
            self.planned += 1
            self.visits[plan.shard] += 1
            if self.unvisited is not None and self.visits[plan.shard] == 1:
                del self.unvisited[bisect.bisect_left(self.unvisited, plan.shard)]
            return plan
        return None

    def _shard_for(self, client: ClientView) -> int | None:
        """This round's shard for ``client``, where the round has a slot for every
        shard; None: the cursor's (ShardCursor.next).

        A round that large visits every shard by itself, so a client that holds
        shards trains on the one of them this round has visited least, however far
        its shard runs ahead of others across rounds; only the round's last slots go
        to shards it has not visited yet, fetched if need be. Under the cursor's
        bound on running ahead, a crowd holding shards unevenly stalled whole rounds
        on shard fetches (docs/coordinator.md, shard affinity). The mean undoes the
        uneven visits (``shard_weights``)."""
        shards = self.cursor.shards
        if self.target < shards:
            return None  # rounds this small cover the shards across rounds: cycles
        held = [s for s in client.held if 0 <= s < shards]
        unvisited = shards - len(self.visits)
        if unvisited and self.target - self.planned <= unvisited:
            mine = [s for s in held if not self.visits[s]]
            if mine:
                return mine[0]
            if self.unvisited is None:
                self.unvisited = [s for s in range(shards) if not self.visits[s]]
            return self.unvisited[int(self.rng.integers(len(self.unvisited)))]
        if not held:
            return None
        return min(held, key=self.visits.__getitem__)  # newest first among equals

    def on_task_created(self, task: Task) -> None:
        if task.round == self.round:
            self.round_tasks[task.task_id] = task

    def on_result(self, task: Task, update: np.ndarray, now: float) -> Outcome:
        s = self.staleness_of(task)
        if task.round != self.round or self.phase is not RoundPhase.COLLECTING:
            return Outcome(accepted=False, staleness=s, reason="stale")
        self.results[task.task_id] = self.dense(task, update).copy()
        self.weights[task.task_id] = self.sample_weight(task)
        if task.subnet is not None:
            self.subnets[task.task_id] = task.subnet
        if len(self.results) >= self.target:
            return Outcome(accepted=True, staleness=s, step=self._close(now))
        grace = self.config.quorum_grace
        if (
            grace is not None
            and self.deadline is not None
            and len(self.results) == math.ceil(self.config.quorum * self.target)
        ):
            self.deadline = min(self.deadline, now + grace * max(0.0, now - self.opened_at))
        return Outcome(accepted=True, staleness=s)

    def on_lease_lost(self, task: Task, now: float) -> bool:
        if task.round != self.round or self.phase is not RoundPhase.COLLECTING:
            return False
        self.reissue.append(task)
        return True

    def on_tick(self, now: float) -> StepReport | None:
        if self.phase is not RoundPhase.COLLECTING or self.deadline is None:
            return None
        if now < self.deadline:
            return None
        need = math.ceil(self.config.quorum * self.target)
        if self.results and len(self.results) >= need:
            return self._close(now)
        # Below quorum: replicate unfinished work to idle clients, wait once more.
        self.deadline = now + self.config.round_deadline_s
        queued = {t.task_id for t in self.reissue}
        for tid, t in sorted(self.round_tasks.items()):
            if t.state is TaskState.OPEN and tid not in self.results and tid not in queued:
                self.reissue.append(t)
        return None

    def _close(self, now: float) -> StepReport:
        ids = sorted(self.results)
        updates = [self.results[i] for i in ids]
        weights = self.shard_weights(ids)
        subnets = [self.subnets.get(i) for i in ids]
        direction = self.direction(updates, weights, subnets)
        scale = self.step_scale()
        if self.auto_outer is not None:
            tasks = [self.round_tasks[i] for i in ids if i in self.round_tasks]
            scale *= self._auto_lr(updates, weights, direction, self.coverage(tasks))
        self.outer.step(self.model.params.data, direction, scale)
        dropped = tuple(
            tid
            for tid, t in sorted(self.round_tasks.items())
            if t.state is TaskState.OPEN and tid not in self.results
        )
        tasks = self.round_tasks
        work = sum(tasks[i].work if i in tasks else 1.0 for i in ids) / len(ids)
        report = self.step_version(len(ids), work=work)
        self._move(RoundPhase.IDLE)
        self.results = {}
        self.weights = {}
        self.subnets = {}
        self.round_tasks = {}
        self.reissue.clear()
        self.deadline = None
        return StepReport(stepped=report.stepped, merged=report.merged, dropped=dropped)

    def shard_weights(self, ids: list[int]) -> list[float]:
        """The results' weights in the round's mean: each one's sample weight over
        the number of results from its shard. So each shard weighs its rows however
        many tasks visited it (a stratified mean): a crowd holding shards unevenly
        does not tilt the model toward the shards with more holders. A result whose
        task is not known (restored from a checkpoint) counts alone."""
        tasks = self.round_tasks
        count = Counter(tasks[i].shard for i in ids if i in tasks)
        return [
            self.weights.get(i, 1.0) / (count[tasks[i].shard] if i in tasks else 1) for i in ids
        ]

    def _auto_lr(
        self,
        updates: list[np.ndarray],
        weights: list[float],
        direction: np.ndarray,
        coverage: float,
    ) -> float:
        """The round's outer lr under "auto": OuterLrScale's, times the held-out
        plateau's decay (``plateau_*``: where the loss stops improving, the outer
        step halves, as a machine's lr would)."""
        assert self.auto_outer is not None
        lr = self.auto_outer.observe(updates, weights, direction, coverage)
        self.last_outer_lr = lr * self.lr_decay
        logger.debug(
            "round %d: outer lr %.3f (plateau %.3f) from %d deltas over %.2f of the rows "
            "(signal %s, noise %s)",
            self.round,
            self.last_outer_lr,
            self.lr_decay,
            len(updates),
            coverage,
            self.auto_outer.signal,
            self.auto_outer.noise,
        )
        return self.last_outer_lr

    def round_outer_lr(self) -> float | None:
        return self.last_outer_lr

    def averaged_with(self) -> int:
        return fewest_averaged(self.config, self.target)

    def pending(self) -> int:
        return len(self.results)

    def next_deadline(self) -> float | None:
        return self.deadline if self.phase is RoundPhase.COLLECTING else None

    def state_dict(self) -> dict[str, Any]:
        state = {
            **super().state_dict(),
            "outer": self.outer.state_dict(),
            "round": self.round,
            "target": self.target,
            "results": {int(k): v.copy() for k, v in self.results.items()},
            "weights": {int(k): float(w) for k, w in self.weights.items()},
            "subnets": {int(k): s.to_state() for k, s in self.subnets.items()},
        }
        if self.auto_outer is not None:
            state["outer_lr_scale"] = self.auto_outer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Results acknowledged before a restart are kept; missing slots are replanned."""
        super().load_state_dict(state)
        self.outer.load_state_dict(state["outer"])
        if self.auto_outer is not None:
            self.auto_outer.load_state_dict(state.get("outer_lr_scale"))
        self.round = int(state["round"])
        self.target = int(state["target"])
        self.results = {int(k): np.array(v, dtype=np.float32) for k, v in state["results"].items()}
        # (a checkpoint from before sample weights has none: those results count 1)
        self.weights = {int(k): float(w) for k, w in state.get("weights", {}).items()}
        spec = self.model.params.spec
        self.subnets = {
            int(k): Subnet.from_state(spec, s) for k, s in state.get("subnets", {}).items()
        }
        self.round_tasks = {}
        self.reissue.clear()
        self.visits.clear()
        self.unvisited = None
        self.planned = len(self.results)
        self.deadline = None
        self.phase = RoundPhase.COLLECTING if self.results else RoundPhase.IDLE
