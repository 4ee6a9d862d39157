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

import numpy as np

from coordinator.core.config import DataSection, StrategySection
from coordinator.core.strategies.aggregate import OuterLrScale, OuterOptimizer
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
        auto = c.outer_lr == "auto"
        lr = 1.0 if auto else float(c.outer_lr)
        outer = OuterOptimizer(kind=c.outer_optimizer, lr=lr, momentum=c.outer_momentum)
        scale = OuterLrScale(kind=c.outer_optimizer, momentum=c.outer_momentum) if auto else None
        super().__init__(
            outer=outer, model=model, config=config, data=data, rng=rng, auto_outer=scale
        )
        # under auto no round has chosen one yet: the gauge stays absent until one does
        self.last_outer_lr = None if auto else lr

    def direction(
        self, updates: list[np.ndarray], weights: list[float], subnets: list[Subnet | None]
    ) -> np.ndarray:
        return self.combine(updates, weights, subnets)
