"""Held-out evaluation every N versions, at most a set share of the core's time.

Runs in the coordinator itself (an evaluation must not depend on an untrusted
client). ``max_samples`` caps the test rows used, a fixed prefix, so the numbers
compare across versions. A version is due every ``every_versions``; a driver
with a clock may hand the evaluator a ``timer`` (the served coordinator does),
and then an evaluation also waits until the time since the last one is at least
its measured cost over ``max_share``: the core thread spends at most about that
share on evaluations however fast versions come. Without a timer (the simulator,
tests) the cadence is versions only, and a run stays bitwise reproducible.
"""

from __future__ import annotations

from collections.abc import Callable

from coordinator.core.config import EvalSection
from coordinator.core.events import Evaluated
from nn.data import Dataset
from nn.params import Params
from nn.train import evaluate

#: weight of the newest evaluation in the running cost (an EMA)
COST_GAIN = 0.2


class Evaluator:
    __slots__ = ("X", "_timed", "config", "cost", "last", "timer", "y")

    def __init__(
        self, dataset: Dataset, config: EvalSection, timer: Callable[[], float] | None = None
    ) -> None:
        n = config.max_samples or dataset.X_test.shape[0]
        self.X = dataset.X_test[:n]
        self.y = dataset.y_test[:n]
        self.config = config
        self.last: Evaluated | None = None
        #: seconds of a running clock (e.g. ``time.perf_counter``), or None
        self.timer = timer
        #: running mean of an evaluation's seconds, from the second timed run on
        self.cost: float | None = None
        self._timed = 0

    def due(self, version: int, now: float | None = None) -> bool:
        if version % self.config.every_versions != 0:
            return False
        last = self.last
        if last is None:
            return True
        if last.version == version:
            return False
        if self.cost is None or now is None:
            return True
        return now - last.now >= self.cost / self.config.max_share

    def run(self, params: Params, version: int, now: float) -> Evaluated:
        timer = self.timer
        t0 = timer() if timer is not None else 0.0
        r = evaluate(params, self.X, self.y)
        seconds = None
        if timer is not None:
            seconds = timer() - t0
            c = self.cost
            if self._timed:  # (the first run compiles the kernels: not its cost)
                self.cost = seconds if c is None else c + COST_GAIN * (seconds - c)
            self._timed += 1
        self.last = Evaluated(
            version=version, loss=r.loss, accuracy=r.accuracy, n=r.n, now=now, seconds=seconds
        )
        return self.last
