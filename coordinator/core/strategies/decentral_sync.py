"""decentral-sync: each slot takes tau local steps from the round's version.

The round's deltas are averaged (weighted by each task's rows) and applied by
the outer optimizer: sgd with ``outer_lr`` 1 is plain model averaging (local
SGD / FedAvg); Nesterov momentum (e.g. lr 0.7, momentum 0.9) is DiLoCo's outer
step. ``outer_lr = "auto"`` sizes each round's outer lr by the share of its mean
that is signal (aggregate.OuterLrScale): a round of a few volunteers, or of a
converging model, is mostly noise, which momentum would amplify; a large one
steps near the stability edge.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from coordinator.core.config import DataSection, StrategySection
from coordinator.core.strategies.aggregate import OuterLrScale, OuterOptimizer
from coordinator.core.strategies.base import ModelState
from coordinator.core.strategies.rounds import RoundStrategy
from nn.subnet import Subnet

logger = logging.getLogger(__name__)


class DecentralSync(RoundStrategy):
    name = "decentral-sync"
    task_kind = "local"

    def __init__(
        self,
        *,
        model: ModelState,
        config: StrategySection,
        data: DataSection,
        rng: np.random.Generator,
    ) -> None:
        c = config
        auto = c.outer_lr == "auto"
        lr = 1.0 if auto else float(c.outer_lr)
        outer = OuterOptimizer(kind=c.outer_optimizer, lr=lr, momentum=c.outer_momentum)
        super().__init__(outer=outer, model=model, config=config, data=data, rng=rng)
        self.auto_outer = (
            OuterLrScale(kind=c.outer_optimizer, momentum=c.outer_momentum) if auto else None
        )
        #: the outer lr of the last round (the job's outer_lr, or auto's choice)
        self.last_outer_lr = lr

    def round_lr(
        self,
        updates: list[np.ndarray],
        weights: list[float],
        direction: np.ndarray,
        coverage: float,
    ) -> float:
        if self.auto_outer is None:
            return 1.0
        # times the held-out plateau's decay (strategy.plateau_*): where the loss stops
        # improving, the outer step halves, as a machine's lr would
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

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.auto_outer is not None:
            state["outer_lr_scale"] = self.auto_outer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.auto_outer is not None:
            self.auto_outer.load_state_dict(state.get("outer_lr_scale"))

    def direction(
        self, updates: list[np.ndarray], weights: list[float], subnets: list[Subnet | None]
    ) -> np.ndarray:
        return self.combine(updates, weights, subnets)
