"""decentral-async (the default): clients take tau local steps and send deltas.

A client trains from the version it holds and returns ``delta = local - base``.
``fedasync`` merges each delta at once, ``params += alpha · f(s) · delta``
(FedAsync); ``fedbuff`` collects ``buffer_k`` staleness-weighted deltas and
takes one outer step on their mean (FedBuff). A delta older than
``max_staleness`` versions is refused as stale.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from coordinator.leases import Task, TaskPlan
from coordinator.strategies.aggregate import OuterOptimizer
from coordinator.strategies.base import ClientView, Outcome, Strategy


class DecentralAsync(Strategy):
    name = "decentral-async"
    task_kind = "local"
    pipelined = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        c = self.config
        self.outer = OuterOptimizer(
            kind=c.outer_optimizer, lr=c.outer_lr, momentum=c.outer_momentum
        )
        self.buffer: list[np.ndarray] = []

    def task_for(self, client: ClientView, now: float) -> TaskPlan | None:
        return self.new_plan()

    def on_result(self, task: Task, update: np.ndarray, now: float) -> Outcome:
        s = self.staleness_of(task)
        if self.too_stale(s):
            return Outcome(accepted=False, staleness=s, reason="stale")
        w = self.scale(s)
        if self.config.aggregation == "fedasync":
            self.model.params.data += np.float32(self.config.alpha * w) * update
            return Outcome(accepted=True, staleness=s, step=self.step_version(1))
        self.buffer.append((np.float32(w) * update).astype(np.float32))
        if len(self.buffer) < self.config.buffer_k:
            return Outcome(accepted=True, staleness=s)
        combined = self.combine(self.buffer)
        merged = len(self.buffer)
        self.buffer = []
        self.outer.step(self.model.params.data, combined)
        return Outcome(accepted=True, staleness=s, step=self.step_version(merged))

    def pending(self) -> int:
        return len(self.buffer)

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "outer": self.outer.state_dict(),
            "buffer": [b.copy() for b in self.buffer],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.outer.load_state_dict(state["outer"])
        self.buffer = [np.array(b, dtype=np.float32) for b in state["buffer"]]
