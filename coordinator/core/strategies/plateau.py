"""Reduce-on-plateau: the lr multiplier a held-out loss sets.

One rule for the crowd (strategies/base.py) and the one machine it is measured
against (crowdgrad/anchor.py). ``observe(loss, at, per)`` counts evaluations
without a new best; once there are ``patience`` of them and ``at`` has moved
``patience x per`` since the best (a crowd's rounds of K tasks on the model's
progress clock, so that neither a fast crowd's frequent evaluations nor short
tasks cut sooner), the multiplier is cut by
``factor``, not below ``minimum``. A NaN loss is no evidence either way;
``patience`` 0 turns the rule off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class LrPlateau:
    patience: int
    factor: float
    minimum: float
    #: the multiplier on the lr now
    decay: float = 1.0
    best: float = math.inf
    #: evaluations since the best
    since_best: int = 0
    #: ``at`` of the best (or of the last cut)
    best_at: float = 0.0

    def observe(self, loss: float, at: float, per: float = 1.0) -> bool:
        """One evaluation's loss at progress ``at``; True when the multiplier fell."""
        if self.patience == 0 or math.isnan(loss):
            return False
        if loss < self.best:
            self.best, self.since_best, self.best_at = loss, 0, at
            return False
        self.since_best += 1
        if self.since_best < self.patience or (at - self.best_at) / per < self.patience:
            return False
        before = self.decay
        self.decay = max(self.minimum, self.decay * self.factor)
        self.since_best, self.best_at = 0, at
        return self.decay < before
