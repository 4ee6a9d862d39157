"""layer-split: FedAsync over the two blocks of a cut model (coordinator/core/layersplit.py).

Each result moves only its block: ``block += alpha · f(s) · delta`` (the lower
one's auxiliary head too), where the staleness ``s`` counts the steps of that
block since the task was made, not the other block's. Which task a client gets:
an upper task when a boundary shard waits and the client fetches shards, else a
lower task on the next shard (when it returns boundaries), else none. A lower
result's boundary becomes a shard for an upper task once it is merged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from coordinator.core.config import DataSection, StrategySection
from coordinator.core.layersplit import LOWER, UPPER, Boundaries, SplitBlocks
from coordinator.core.leases import Task, TaskPlan
from coordinator.core.strategies.base import ClientView, ModelState, Outcome, Strategy


class LayerSplit(Strategy):
    name = "decentral-async"
    task_kind = "local"
    pipelined = True

    def __init__(
        self,
        *,
        blocks: SplitBlocks,
        boundaries: Boundaries,
        model: ModelState,
        config: StrategySection,
        data: DataSection,
        rng: np.random.Generator,
    ) -> None:
        super().__init__(model=model, config=config, data=data, rng=rng)
        self.blocks = blocks
        self.boundaries = boundaries
        #: steps taken by each block (a result's staleness counts its own block's)
        self.block_versions = [0, 0]

    def task_for(self, client: ClientView, now: float) -> TaskPlan | None:
        if client.shards:
            index = self.boundaries.take()
            if index is not None:
                return self._plan(UPPER, index)
        if client.boundary:
            return self._plan(LOWER, self.cursor.next())
        return None

    def _plan(self, block: int, shard: int) -> TaskPlan:
        return TaskPlan(
            kind=self.task_kind,
            shard=shard,
            seed=int(self.rng.integers(0, 2**31 - 1)),
            steps=self.config.nominal_tau,
            batch=self.data.batch,
            block=block,
        )

    def on_task_created(self, task: Task) -> None:
        assert task.block is not None
        task.block_version = self.block_versions[task.block]

    def on_lease_lost(self, task: Task, now: float) -> bool:
        if task.block == UPPER:  # its boundary shard waits for another client
            self.boundaries.lost(task.shard)
        else:
            self.cursor.requeue(task.shard)
        return False

    def on_result(self, task: Task, update: np.ndarray, now: float) -> Outcome:
        block = task.block
        assert block is not None
        s = self.block_versions[block] - task.block_version
        if self.too_stale(s):
            if block == UPPER:
                self.boundaries.lost(task.shard)
            return Outcome(accepted=False, staleness=s, reason="stale")
        scale = self.config.alpha * self.scale(s) * self.step_scale()
        with self.model.lock:
            self.blocks.merge(block, self.model.params, update, scale)
            step = self.step_version(1)
        self.block_versions[block] += 1
        if block == LOWER:
            assert task.boundary is not None, "a lower result carries its boundary"
            self.boundaries.add(task.shard, task.boundary)
            task.boundary = None
        else:
            self.boundaries.trained(task.shard)
        return Outcome(accepted=True, staleness=s, step=step)

    def summary(self) -> dict[str, Any]:
        """For /api/status: each block's steps and the boundary shards in flight. A
        job whose lower steps stand still while clients wait has no client that
        returns boundaries (``hello.boundary``; an older client takes upper tasks only)."""
        b = self.boundaries
        return {
            "cut": self.blocks.cut,
            "lower_steps": self.block_versions[LOWER],
            "upper_steps": self.block_versions[UPPER],
            "boundaries_waiting": b.waiting,
            "boundaries_leased": len(b) - b.waiting,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "aux": self.blocks.aux.copy(),
            "block_versions": list(self.block_versions),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.blocks.aux[:] = np.asarray(state["aux"], dtype=np.float32)
        self.block_versions = [int(v) for v in state["block_versions"]]
