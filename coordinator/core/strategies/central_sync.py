"""central-sync: a parameter server averages one round of gradients, then steps.

Each slot of a round is a gradient at the round's version; the server steps
``params += lr · (−mean gradient)``, the mean weighted by each task's rows,
through the outer optimizer (sgd, or Nesterov momentum), so the server step is
the only optimizer state.
"""

from __future__ import annotations

import numpy as np

from coordinator.core.config import DataSection, StrategySection
from coordinator.core.strategies.aggregate import OuterOptimizer
from coordinator.core.strategies.base import ModelState
from coordinator.core.strategies.rounds import RoundStrategy
from nn.subnet import Subnet


class CentralSync(RoundStrategy):
    name = "central-sync"
    task_kind = "gradient"

    def __init__(
        self,
        *,
        model: ModelState,
        config: StrategySection,
        data: DataSection,
        rng: np.random.Generator,
    ) -> None:
        c = config
        outer = OuterOptimizer(kind=c.outer_optimizer, lr=c.lr, momentum=c.outer_momentum)
        super().__init__(outer=outer, model=model, config=config, data=data, rng=rng)

    def direction(
        self, updates: list[np.ndarray], weights: list[float], subnets: list[Subnet | None]
    ) -> np.ndarray:
        return -self.combine(updates, weights, subnets)
