"""Held-out evaluation every N versions, feeding events and the stop condition.

Runs in the coordinator itself (evaluation is cheap next to training and must
not depend on an untrusted client). ``max_samples`` caps the test rows used,
taking a fixed prefix so the number is comparable across versions.
"""

from __future__ import annotations

from coordinator.core.config import EvalSection
from coordinator.core.events import Evaluated
from nn.data import Dataset
from nn.params import Params
from nn.train import evaluate


class Evaluator:
    __slots__ = ("X", "config", "last", "y")

    def __init__(self, dataset: Dataset, config: EvalSection) -> None:
        n = config.max_samples or dataset.X_test.shape[0]
        self.X = dataset.X_test[:n]
        self.y = dataset.y_test[:n]
        self.config = config
        self.last: Evaluated | None = None

    def due(self, version: int) -> bool:
        return version % self.config.every_versions == 0 and (
            self.last is None or self.last.version != version
        )

    def run(self, params: Params, version: int, now: float) -> Evaluated:
        r = evaluate(params, self.X, self.y)
        self.last = Evaluated(version=version, loss=r.loss, accuracy=r.accuracy, n=r.n, now=now)
        return self.last
