"""decentral-async (the default): clients take tau local steps and send deltas.

A client trains from the version it holds and returns ``delta = local - base``.
``fedasync`` takes one step per delta, ``params += alpha · step`` (FedAsync),
where ``step`` is ``f(s) · delta`` itself with ``window = 1`` or, by default,
the robust combination (``window_aggregator``) of the newest ``window``
staleness-weighted deltas (robust.SlidingWindow): one result is still one
version, but a bad delta meets honest ones before it moves the model.
``fedbuff`` collects ``buffer_k`` staleness-weighted deltas and takes one
outer step on their mean (FedBuff). ``diloco`` takes 1/K of an outer step
(Nesterov: DiLoCo's) on every arrival (``OuterOptimizer.arrival``), where K is
the crowd's concurrency measured as the running mean of ``staleness + 1``: K
tasks in flight from about the same model move it, and its velocity, as one
synchronous DiLoCo round of their mean would, whatever the crowd's size.
A delta older than ``max_staleness`` versions is refused as stale. With
``staleness.count = "overlap"`` a result's staleness counts only the versions
that touched its subnet's neurons (overlap.OverlapClock), for the weight and
``max_staleness``. Each local task's lr is the job's times ``Strategy.lr_scale``
(the concurrency, and the held-out plateaus: strategies/base.py).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from coordinator.core.config import (
    WINDOW_AUTO,
    WINDOW_AUTO_BYTES,
    WINDOW_AUTO_CLIENTS_PER_DELTA,
    WINDOW_AUTO_MIN,
    DataSection,
    StrategySection,
)
from coordinator.core.leases import Task, TaskPlan
from coordinator.core.strategies.aggregate import OuterOptimizer
from coordinator.core.strategies.base import ClientView, ModelState, Outcome, Strategy
from coordinator.core.strategies.overlap import OverlapClock
from coordinator.core.strategies.robust import SlidingWindow
from nn.subnet import Subnet

log = logging.getLogger(__name__)


class DecentralAsync(Strategy):
    name = "decentral-async"
    task_kind = "local"
    pipelined = True

    def __init__(
        self,
        *,
        model: ModelState,
        config: StrategySection,
        data: DataSection,
        rng: np.random.Generator,
    ) -> None:
        super().__init__(model=model, config=config, data=data, rng=rng)
        c = self.config
        # (outer_lr "auto" is refused by the config for anything but decentral-sync)
        self.outer = OuterOptimizer(
            kind=c.outer_optimizer, lr=float(c.outer_lr), momentum=c.outer_momentum
        )
        self.buffer: list[np.ndarray] = []
        #: each buffered delta's ``sample_weight`` (FedBuff's mean weights by rows)
        self.buffer_weights: list[float] = []
        #: each buffered delta's subnet (None: the whole model)
        self.buffer_subnets: list[Subnet | None] = []
        #: the buffered tasks' shares of a round (Task.work), summed
        self.buffer_work = 0.0
        #: clients connected at the last lease ("auto" windows scale with it)
        self.crowd = 0
        #: staleness.count = "overlap": the steps that touched each hidden neuron
        self.overlap = (
            OverlapClock(self.model.params.spec) if c.staleness.count == "overlap" else None
        )
        #: FedAsync's last ``window`` deltas (window > 1 only)
        size = self.model.params.data.size
        k = c.window_for(size)
        self.recent = (
            SlidingWindow(k, size, c.window_aggregator, byzantine_fraction=c.byzantine_fraction)
            if c.aggregation in ("fedasync", "diloco") and k > 1
            else None
        )
        if c.aggregation == "fedasync" and c.window == "auto" and k < WINDOW_AUTO:
            log.warning(
                "FedAsync window %d, not %d: %d deltas of %.0f MB exceed %d MB; "
                "set strategy.window to choose (1 = no protection from a bad delta)",
                k, WINDOW_AUTO, WINDOW_AUTO, 4 * size / 1e6, WINDOW_AUTO_BYTES >> 20,
            )  # fmt: skip

    @property
    def merges_in_place(self) -> bool:
        """Every sub-model result lands alone, in place (FedAsync without a window)."""
        return self.recent is None and self.config.aggregation == "fedasync"

    def task_for(self, client: ClientView, now: float) -> TaskPlan | None:
        self.crowd = client.connected
        return self.new_plan(client)

    def on_task_created(self, task: Task) -> None:
        if self.overlap is not None:
            self.overlap.created(task)

    def staleness_of(self, task: Task) -> int:
        versions = super().staleness_of(task)
        return versions if self.overlap is None else self.overlap.staleness(task, versions)

    def on_result(self, task: Task, update: np.ndarray, now: float) -> Outcome:
        s = self.staleness_of(task)
        clock = self.overlap
        if clock is not None:
            clock.forget(task)
        if self.too_stale(s):
            return Outcome(accepted=False, staleness=s, reason="stale")
        w = self.scale(s)
        k = self.observe_concurrency(s)
        if self.config.aggregation == "fedasync":
            if task.subnet is not None and self.recent is None:  # in place: the slice only
                scale = self.config.alpha * w * self.step_scale()
                with self.model.lock:
                    task.subnet.add_to(self.model.params, update, scale)
                    step = self.step_version(
                        1, within=task.subnet, update=update, scale=scale, work=task.work
                    )
                if clock is not None:
                    clock.step_one(task.subnet)
                return Outcome(accepted=True, staleness=s, step=step)
            step = self._merged(w, self.dense(task, update))
            self.model.params.data += np.float32(self.config.alpha * self.step_scale()) * step
            if clock is not None:  # a window's step moves its other deltas' subnets too
                clock.step([task.subnet if self.recent is None else None])
            return Outcome(accepted=True, staleness=s, step=self.step_version(1, work=task.work))
        if self.config.aggregation == "diloco":
            # as old as the crowd makes every result: full weight; far older, less
            step = self._merged(min(1.0, 2.0 * k / (s + 1)), self.dense(task, update))
            self.outer.arrival(self.model.params.data, step, 1.0 / k, self.step_scale())
            if clock is not None:
                clock.step([task.subnet if self.recent is None else None])
            return Outcome(accepted=True, staleness=s, step=self.step_version(1, work=task.work))
        self.buffer.append((np.float32(w) * self.dense(task, update)).astype(np.float32))
        self.buffer_weights.append(self.sample_weight(task))
        self.buffer_subnets.append(task.subnet)
        self.buffer_work += task.work
        if len(self.buffer) < self.config.buffer_k:
            return Outcome(accepted=True, staleness=s)
        combined = self.combine(self.buffer, self.buffer_weights, self.buffer_subnets)
        merged = len(self.buffer)
        if clock is not None:
            clock.step(self.buffer_subnets)
        work, self.buffer_work = self.buffer_work / merged, 0.0
        self.buffer, self.buffer_weights, self.buffer_subnets = [], [], []
        self.outer.step(self.model.params.data, combined, self.step_scale())
        return Outcome(accepted=True, staleness=s, step=self.step_version(merged, work=work))

    def _merged(self, w: float, update: np.ndarray) -> np.ndarray:
        """The step one arrival takes: the delta itself, or with ``window > 1`` the
        aggregator's combination of the last ``window`` (staleness-weighted)
        deltas. Each delta then counts in ``window`` steps at about ``1/window``
        weight, so the total moved matches FedAsync's, but one bad delta is
        combined with honest ones before it touches the model."""
        scaled = (np.float32(w) * update).astype(np.float32)
        if self.recent is None:
            return scaled
        use = None
        if self.config.window == "auto":  # a window over a few clients' deltas lags
            use = self.crowd // WINDOW_AUTO_CLIENTS_PER_DELTA
            if use < WINDOW_AUTO_MIN:  # too few to outvote anything: the delta alone
                use = 1
        return self.recent.push(scaled, use)

    def pending(self) -> int:
        return len(self.buffer)

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "outer": self.outer.state_dict(),
            "buffer": [b.copy() for b in self.buffer],
            "buffer_weights": list(self.buffer_weights),
            "buffer_subnets": [None if s is None else s.to_state() for s in self.buffer_subnets],
            "buffer_work": self.buffer_work,
            "recent": None if self.recent is None else self.recent.state_dict(),
            **({} if self.overlap is None else self.overlap.state_dict()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.outer.load_state_dict(state["outer"])
        self.buffer = [np.array(b, dtype=np.float32) for b in state["buffer"]]
        weights = state.get("buffer_weights", [1.0] * len(self.buffer))  # older checkpoints
        self.buffer_weights = [float(w) for w in weights]
        spec = self.model.params.spec
        subnets = state.get("buffer_subnets", [None] * len(self.buffer))
        self.buffer_subnets = [None if s is None else Subnet.from_state(spec, s) for s in subnets]
        self.buffer_work = float(state.get("buffer_work", len(self.buffer)))
        if self.recent is not None and state.get("recent") is not None:
            self.recent.load_state_dict(state["recent"])
        if self.overlap is not None:
            self.overlap.load_state_dict(state)
