"""The cost model: the schedule's timings without numerics, for models too big to hold.

Theory of operation. The ``extreme`` preset has 2.1 B parameters (8.6 GB a
copy); no coordinator can allocate it here, so a ``mode = "cost"`` scenario runs
this model instead of the real core. It uses the same engine, links, churn and
compute rates as the driver, and replays each strategy's message pattern with
sizes only:

* a task is a small frame (``TASK_BYTES``); a model or an update is
  ``ceil(bytes / max_message_bytes)`` frames (the neuron-group chunking of
  protocol.chunking), ``params × 4`` bytes for fp32 plus ``CHUNK_OVERHEAD`` per
  frame;
* async strategies: a client fetches the model when its copy is stale, computes
  ``steps × batch`` samples (``tau`` steps for decentral, one gradient for
  central), uploads, and the server steps at once (one version per result);
* sync strategies: a round gives every connected client one task at the same
  version and steps when all of them have reported (a dropped client leaves
  the round).

What it leaves out, and the report says so: no accuracy, no staleness effects
on convergence, no server-side pacing beyond the links themselves, no leases,
no codecs (every transfer is fp32, a slow link's int8 of linkcodecs.py too).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from simulations.churn import Lifecycle
from simulations.engine import Engine, Priority
from simulations.network import Link
from simulations.report import RunResult, Sample, run_summary
from simulations.scenario import Scenario

TASK_BYTES = 256
RESULT_BYTES = 128
CHUNK_OVERHEAD = 96


class _Client:
    def __init__(self, sim: CostSimulation, index: int) -> None:
        self.sim = sim
        self.index = index
        self.rng = sim.engine.rng(f"player/{index}")
        self.flops = max(1.0, sim.scenario.clients.sample_flops(self.rng))
        self.link: Link | None = None
        self.session = 0
        self.held = -1  # model version held
        self.busy = False
        self.lifecycle = Lifecycle(
            sim.engine, sim.scenario.clients.churn, name=str(index),
            on_leave=self.leave, on_join=self.join,
        )  # fmt: skip

    def join(self) -> None:
        if self.sim.done:
            return
        self.session += 1
        self.link = Link(self.sim.engine, self.sim.link_spec, name=f"{self.index}.{self.session}")
        self.busy = False
        self.sim.online.add(self.index)
        self.sim.dispatch()

    def leave(self) -> None:
        if self.link is not None:
            self.sim.frames_lost += self.link.drop()
        self.link = None
        self.busy = False
        self.sim.online.discard(self.index)
        self.sim.left(self)
        self.sim.drops += 1

    def _send(self, *, up: bool, nbytes: int, then: Callable[..., Any] | None = None) -> None:
        if self.link is None:
            return
        if up:
            self.sim.bytes_up += nbytes
        else:
            self.sim.bytes_down += nbytes
        self.link.send(up=up, nbytes=nbytes, on_delivery=then or (lambda: None))

    def _send_blob(self, *, up: bool, then: Callable[[], None]) -> None:
        """A model or update: its frames in order, ``then`` when the last lands."""
        frames = self.sim.frames
        for i, size in enumerate(frames):
            self._send(up=up, nbytes=size, then=then if i == len(frames) - 1 else None)

    def start_task(self, version: int, steps: int) -> None:
        """Server side: lease a task at ``version``; the model follows if stale."""
        self.busy = True
        session = self.session
        self._send(up=False, nbytes=TASK_BYTES)
        if self.held != version:
            self._send_blob(up=False, then=lambda: self._compute(session, version, steps))
        else:
            self._send(up=False, nbytes=0, then=lambda: self._compute(session, version, steps))

    def _compute(self, session: int, version: int, steps: int) -> None:
        if session != self.session or self.link is None:
            return
        self.held = version
        seconds = self.sim.step_flops * steps / self.flops
        self.sim.engine.schedule(
            seconds, self._upload, session, version, steps, priority=Priority.COMPUTE
        )

    def _upload(self, session: int, version: int, steps: int) -> None:
        if session != self.session or self.link is None:
            return
        self._send(up=True, nbytes=RESULT_BYTES)
        self._send_blob(up=True, then=lambda: self.sim.result(self, session, version, steps))


class CostSimulation:
    """One cost-model run; ``run()`` returns a RunResult without accuracy."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        label: str = "",
        point: dict[str, Any] | None = None,
        progress: Callable[[float, float], None] | None = None,
    ) -> None:
        self.scenario = scenario
        self.label = label or scenario.name
        self.point = point or {}
        self.progress = progress
        job = scenario.job
        spec = job.spec
        self.strategy = job.strategy.name
        self.sync = self.strategy.endswith("-sync")
        self.steps_per_task = (
            job.strategy.nominal_tau if self.strategy.startswith("decentral") else 1
        )
        self.step_flops = spec.flops_per_sample(train=True) * job.data.batch
        limits = scenario.limits
        nbytes = spec.num_params * 4
        per = limits.max_message_bytes - CHUNK_OVERHEAD
        n = max(1, math.ceil(nbytes / per))
        self.frames = [per + CHUNK_OVERHEAD] * (n - 1) + [nbytes - per * (n - 1) + CHUNK_OVERHEAD]
        self.engine = Engine(seed=scenario.seed)
        self.link_spec = scenario.link
        self.online: set[int] = set()
        self.version = 0
        self.steps = 0
        self.bytes_up = self.bytes_down = 0
        self.frames_lost = 0
        self.drops = 0
        self.done = False
        self.reason = ""
        self.round: set[int] = set()  # sync: clients still owing this round's result
        self.series: list[Sample] = []
        self.horizon = min(job.stop.max_time_s or math.inf, scenario.run.max_virtual_s)
        self.clients = [_Client(self, i) for i in range(scenario.clients.count)]

    def dispatch(self) -> None:
        if self.done:
            return
        if not self.sync:
            for i in sorted(self.online):
                c = self.clients[i]
                if not c.busy:
                    c.start_task(self.version, self.steps_per_task)
        elif not self.round and self.online:
            self.round = set(self.online)
            for i in sorted(self.round):
                self.clients[i].start_task(self.version, self.steps_per_task)

    def left(self, c: _Client) -> None:
        if self.sync and c.index in self.round:
            self.round.discard(c.index)
            if not self.round:
                self._step(0)

    def result(self, c: _Client, session: int, version: int, steps: int) -> None:
        if self.done or session != c.session:
            return
        c.busy = False
        if self.sync:
            self.steps += steps
            self.round.discard(c.index)
            if not self.round:
                self._step(1)
        else:
            self.steps += steps
            self._step(1)

    def _step(self, versions: int) -> None:
        self.version += versions
        max_steps = self.scenario.run.max_steps
        if max_steps is not None and self.steps >= max_steps:
            self._stop("max_steps")
            return
        self.dispatch()

    def _stop(self, reason: str) -> None:
        if not self.done:
            self.done = True
            self.reason = reason
            self._sample(reschedule=False)

    def _sample(self, reschedule: bool = True) -> None:
        self.series.append(
            Sample(
                t=self.engine.now,
                version=self.version,
                steps=self.steps,
                loss=None,
                accuracy=None,
                bytes_up=self.bytes_up,
                bytes_down=self.bytes_down,
                clients_online=len(self.online),
            )
        )
        if self.progress is not None:
            self.progress(self.engine.now, self.horizon)
        if reschedule and not self.done:
            self.engine.schedule(
                self.scenario.run.sample_every_s, self._sample, priority=Priority.CONTROL
            )

    def run(self) -> RunResult:
        join = self.engine.rng("joins")
        spread = self.scenario.clients.join_over_s
        for c in self.clients:
            t = float(join.uniform(0.0, spread)) if spread > 0 else 0.0
            self.engine.schedule_at(t, self._first_join, c, priority=Priority.CHURN)
        self.engine.schedule_at(0.0, self._sample, priority=Priority.CONTROL)
        self.engine.run_until(self.horizon, until=lambda: self.done)
        if not self.done:
            self._stop("max_time")
        return self._result()

    @staticmethod
    def _first_join(c: _Client) -> None:
        c.join()
        c.lifecycle.start()

    def _result(self) -> RunResult:
        sc = self.scenario
        max_steps = sc.run.max_steps
        linear_s = max_steps * self.step_flops / sc.server.compute if max_steps else None
        ours = self.engine.now if self.reason == "max_steps" else None
        summary = run_summary(
            mode="cost",
            reason=self.reason,
            virtual_seconds=self.engine.now,
            seconds=ours,
            steps=self.steps,
            versions=self.version,
            loss=None,
            accuracy=None,
            time_to_target=None,
            linear_steps=max_steps,
            linear_seconds=linear_s,
            bytes_up=self.bytes_up,
            bytes_down=self.bytes_down,
            players=sc.clients.count,
        ) | {
            "frames_per_model": len(self.frames),
            "drops": self.drops,
            "frames_lost": self.frames_lost,
            "events_run": self.engine.events_run,
        }
        return RunResult(
            label=self.label,
            point=self.point,
            scenario=sc.to_dict(),
            summary=summary,
            series=self.series,
        )


def run_cost(
    scenario: Scenario,
    *,
    label: str = "",
    point: dict[str, Any] | None = None,
    progress: Callable[[float, float], None] | None = None,
) -> RunResult:
    return CostSimulation(scenario, label=label, point=point, progress=progress).run()
