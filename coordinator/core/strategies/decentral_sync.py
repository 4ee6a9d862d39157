"""decentral-sync: each slot takes tau local steps from the round's version.

The round's deltas are averaged (weighted by each task's rows) and applied by
the outer optimizer: sgd with ``outer_lr`` 1 is plain model averaging (local
SGD / FedAvg); Nesterov momentum (e.g. lr 0.7, momentum 0.9) is DiLoCo's outer
step.
"""

from __future__ import annotations

import numpy as np

from coordinator.core.config import DataSection, StrategySection
from coordinator.core.strategies.aggregate import OuterOptimizer
from coordinator.core.strategies.base import ModelState
from coordinator.core.strategies.rounds import RoundStrategy
from nn.subnet import Subnet


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
        outer = OuterOptimizer(kind=c.outer_optimizer, lr=c.outer_lr, momentum=c.outer_momentum)
        super().__init__(outer=outer, model=model, config=config, data=data, rng=rng)

    def direction(
        self, updates: list[np.ndarray], weights: list[float], subnets: list[Subnet | None]
    ) -> np.ndarray:
        return self.combine(updates, weights, subnets)
