"""Early stopping: a job ends when its held-out evaluations stopped improving, with its best model.

``verdict`` takes each held-out evaluation: the job ends at ``stop.target_accuracy``,
or when it has converged (``observe``): ``stop.patience`` evaluations in a row
without a new best of ``stop.monitor`` ("auto": accuracy for a classifier, the loss
for a regression), spanning at least as many rounds (K tasks of ``round_seconds``
on the model's progress clock, K the crowd's concurrency: 700 players make
versions fast and evaluations close, short tasks make them small). ``restore``
then makes the best evaluation's parameters the final model (one version on), as
one-machine training restores its best weights, when they were kept: while the
model fits in ``stop.keep_best_mib``. A crowd's model overfits long after its best
(docs/performance.md, "Ending at its best"); without this the volunteers would
keep paying compute and bandwidth for a worse model.

The best is of this run only: it is not checkpointed (it would double a
checkpoint), so a coordinator restarted from a checkpoint counts again from there.
Why a run ended is checkpointed (``ending``): restarted, it ends again unless the
operator lifted that stop (``ends_again``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from coordinator.core import events as ev
from coordinator.core.config import StopSection
from coordinator.core.strategies.base import ModelState, Strategy
from nn.params import Params
from nn.spec import ModelSpec


class EarlyStop:
    __slots__ = (
        "_best",
        "_keep",
        "best_progress",
        "best_score",
        "best_version",
        "by_accuracy",
        "config",
        "since_best",
    )

    def __init__(self, config: StopSection, spec: ModelSpec) -> None:
        self.config = config
        self._keep = spec.nbytes <= config.keep_best_mib * 2**20
        monitor = config.monitor
        self.by_accuracy = monitor == "accuracy" or (
            monitor == "auto" and spec.loss == "softmax_ce"
        )
        #: the monitored value of the best evaluation, lower is better (-accuracy)
        self.best_score = math.inf
        self.best_version: int | None = None
        #: the progress clock at the best (ModelState.progress)
        self.best_progress = 0.0
        #: evaluations since the last new best
        self.since_best = 0
        self._best: np.ndarray | None = None

    def observe(
        self,
        e: ev.Evaluated,
        params: Params,
        concurrency: float = 1.0,
        progress: float | None = None,
    ) -> bool:
        """Evaluation ``e`` of ``params`` with the model's clock at ``progress``
        (None: its version); whether the job has converged."""
        patience = self.config.patience
        if patience == 0:
            return False
        score, version = (-e.accuracy if self.by_accuracy else e.loss), e.version
        at = float(version) if progress is None else progress
        if score < self.best_score:  # NaN never is: a diverged model is never the best
            self.best_score, self.best_version, self.since_best = score, version, 0
            self.best_progress = at
            if self._keep:
                if self._best is None:
                    self._best = params.data.copy()
                else:
                    self._best[:] = params.data
            return False
        self.since_best += 1
        rounds = (at - self.best_progress) / max(1.0, concurrency)
        return self.since_best >= patience and rounds >= patience

    def verdict(
        self, e: ev.Evaluated, params: Params, strategy: Strategy, upstream: object | None = None
    ) -> str | None:
        """Why the job ends after evaluation ``e`` of ``params``, if it does:
        ``target_accuracy`` or ``converged``; an edge (it has an ``upstream``)
        follows its root's model and never converges on its own: the root ends."""
        target = self.config.target_accuracy
        if target is not None and e.accuracy >= target:
            return "target_accuracy"
        converged = self.observe(e, params, strategy.concurrency, strategy.model.progress)
        return "converged" if converged and upstream is None else None

    def best(self, version: int) -> np.ndarray | None:
        """The best evaluation's parameters (flat float32) if they are kept and are
        not the model's at ``version`` already; else None."""
        if self._best is None or self.best_version == version:
            return None
        return self._best

    def restore(self, model: ModelState, now: float, out: list[ev.Output]) -> int | None:
        """Make the best evaluation's parameters the model, one version on; the
        version they came from, or None (not kept, or the model is the best)."""
        best = self.best(model.version)
        if best is None:
            return None
        with model.lock:
            model.params.data[:] = best
            model.version += 1
            model.whole_steps += 1
        model.changed.mark()
        v, n = model.version, model.contributions
        out.append(ev.ModelUpdated(version=v, contributions=n, now=now))
        return self.best_version


def ending(stop: StopSection, finished: ev.JobFinished) -> dict[str, Any]:
    """What a checkpoint keeps of why the run ended: the reason, the version and
    accuracy it ended at, and the limit that ended it (the stop's own value)."""
    limit = {
        "max_versions": stop.max_versions,
        "target_accuracy": stop.target_accuracy,
        "converged": stop.patience,
        "max_time": stop.max_time_s,
    }.get(finished.reason)
    return {
        "reason": finished.reason,
        "version": finished.version,
        "accuracy": finished.accuracy,
        "limit": limit,
    }


def ends_again(stop: StopSection, version: int, ended: dict[str, Any] | None) -> str | None:
    """Why a core restored at ``version`` ends at once, if it does: its model is at
    or past ``max_versions``, or the checkpoint says the run ended (``ended``, from
    ``ending``) and that stop still holds. Lifting the stop trains on: a higher
    ``max_versions`` or ``target_accuracy`` than was reached, a longer ``max_time_s``
    (counted again from this start), a longer ``patience`` or 0."""
    if stop.max_versions is not None and version >= stop.max_versions:
        return "max_versions"
    if ended is None:
        return None
    reason, limit = ended.get("reason"), ended.get("limit")
    match reason:
        case "target_accuracy":
            target, reached = stop.target_accuracy, ended.get("accuracy")
            holds = target is not None and reached is not None and reached >= target
        case "converged":
            holds = stop.patience > 0 and limit is not None and stop.patience <= limit
        case "max_time":
            holds = stop.max_time_s is not None and limit is not None and stop.max_time_s <= limit
        case _:  # max_versions is the model's own version, checked above
            holds = False
    return reason if holds else None
