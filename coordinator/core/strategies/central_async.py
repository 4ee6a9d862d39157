"""central-async: a parameter server applies each gradient on arrival (Downpour).

Every idle client gets a gradient task at the current version at once. A
gradient computed ``s`` versions ago is applied with the step scaled by the
staleness function; past ``max_staleness`` it is refused as stale.
"""

from __future__ import annotations

import numpy as np

from coordinator.core.leases import Task, TaskPlan
from coordinator.core.strategies.base import ClientView, Outcome, Strategy


class CentralAsync(Strategy):
    name = "central-async"
    task_kind = "gradient"
    # Not pipelined: a task is one gradient, and a prefetched one is computed from
    # a model a whole task older. With the seed table's 8 equal players on the
    # large preset that diverged (every second task from version 0; loss 403,
    # every player closed for rejected updates): docs/simulations.md.

    def task_for(self, client: ClientView, now: float) -> TaskPlan | None:
        return self.new_plan(client)

    def on_result(self, task: Task, update: np.ndarray, now: float) -> Outcome:
        s = self.staleness_of(task)
        if self.too_stale(s):
            return Outcome(accepted=False, staleness=s, reason="stale")
        step = self.config.lr * self.scale(s) * self.step_scale()
        self.model.params.data -= np.float32(step) * update
        return Outcome(accepted=True, staleness=s, step=self.step_version(1))
