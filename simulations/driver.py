"""The simulator's driver: the real Coordinator and real numerics in virtual time.

Theory of operation. The engine owns the clock. Every player is a
:class:`Player`: a compute rate drawn once, a churn :class:`Lifecycle`, and per
connection a :class:`~simulations.network.Link` and a fresh connection id
(``p<i>.<session>``). Everything the coordinator says (``Send``) goes down the
player's link as its exact frame size and is handled by the player when it
lands; everything a player says goes up its link and is fed to
``Coordinator.receive`` when it lands. Nothing is decoded on the way: the
objects travel, their encoded sizes set the timing.

A player answers the protocol the way the desktop client does: ``hello`` on
connect, heartbeats every ``heartbeat_interval``, a ``task`` (plus the model's
chunks when it does not hold that version) is computed with
``client.compute.run_task`` at once, and the ``result`` and the update's chunks
go up ``FLOPs / rate`` seconds later. A newer task supersedes an unfinished one.

Faults: a churn drop kills the link (frames in flight are lost) and the
coordinator hears ``disconnect`` one latency later, or never for a "silent"
drop (then only its heartbeat timeout notices). A coordinator ``Close`` ends the
connection after the frames already sent have landed. A player that rejoins
keeps the model it held and offers its resume token, like a reconnecting tab.

The coordinator is ticked at its own ``next_wakeup()`` (pacing, leases,
heartbeats) and at least every ``run.tick_every_s``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from client.compute import run_task
from coordinator import events as ev
from coordinator.core import Coordinator
from nn.data import Dataset, load_dataset
from nn.optim import Optimizer, OptState
from nn.params import Params
from nn.train import evaluate, train_steps
from protocol import messages as m
from protocol.chunking import Reassembler, chunk_params
from simulations.churn import Lifecycle
from simulations.engine import Engine, Event, Priority
from simulations.network import Link
from simulations.report import RunResult, Sample
from simulations.scenario import Scenario

log = logging.getLogger(__name__)

#: How far a repeated wakeup is pushed past the last tick (see ``_arm_tick``).
TICK_GUARD_S = 1e-6


@dataclass(slots=True)
class Stats:
    steps: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    frames_lost: int = 0
    drops: int = 0
    results_accepted: int = 0
    results_rejected: int = 0
    leases_expired: int = 0
    closes: int = 0
    version: int = 0
    loss: float | None = None
    accuracy: float | None = None
    time_to_target: float | None = None
    finished: str | None = None
    events: dict[str, int] = field(default_factory=dict)


class Player:
    """One simulated client across its connections (see the module docstring)."""

    def __init__(self, sim: Simulation, index: int) -> None:
        self.sim = sim
        self.index = index
        self.rng = sim.engine.rng(f"player/{index}")
        self.flops = max(1.0, sim.scenario.clients.compute.sample(self.rng))
        self.session = 0
        self.conn_id: str | None = None
        self.link: Link | None = None
        self.connected = False  # the coordinator knows this connection
        self.resume: str | None = None
        self.held: Params | None = None
        self.held_version: int | None = None
        self.task: m.Task | None = None
        self.reasm: Reassembler | None = None
        self.compute_event: Event | None = None
        self.heartbeat_event: Event | None = None
        self.heartbeat_interval = 5.0
        self.max_frame = sim.limits.max_message_bytes
        self.gone = False  # left for good (job over)
        self.lifecycle = Lifecycle(
            sim.engine,
            sim.scenario.clients.churn,
            name=str(index),
            on_leave=self.drop,
            on_join=self.connect,
        )

    # -- connection ----------------------------------------------------------------

    def connect(self) -> None:
        if self.gone or self.sim.done:
            return
        self.session += 1
        self.conn_id = f"p{self.index}.{self.session}"
        self.link = Link(self.sim.engine, self.sim.link_spec, name=self.conn_id)
        self.task, self.reasm = None, None
        hello = m.Hello(
            client=f"player-{self.index}",
            flops=self.flops,
            limits=self.sim.limits,
            codecs=tuple(sorted({self.sim.job.codecs.model, self.sim.job.codecs.update})),
            resume=self.resume,
        )
        self._up(hello, first=True)

    def _up(self, msg: m.Message, *, first: bool = False, size: int | None = None) -> None:
        link, conn_id = self.link, self.conn_id
        if link is None or conn_id is None:
            return
        nbytes = size if size is not None else len(m.encode(msg))
        self.sim.stats.bytes_up += nbytes
        link.send(
            up=True,
            nbytes=nbytes,
            on_delivery=self.sim.at_server,
            args=(self, conn_id, msg, nbytes, first),
        )

    def drop(self) -> None:
        """Churn: the player vanishes now, mid-whatever."""
        if self.link is None:
            return
        self.sim.stats.drops += 1
        self.sim.stats.frames_lost += self.link.drop()
        conn_id, was_known = self.conn_id, self.connected
        self._teardown()
        if was_known and conn_id is not None:
            silent = self.rng.random() < self.sim.scenario.clients.silent_drops
            if not silent:
                delay = self.sim.link_spec.latency.sample(self.rng)
                self.sim.engine.schedule(
                    delay, self.sim.disconnect, conn_id, "dropped", priority=Priority.CHURN
                )

    def _teardown(self) -> None:
        self.sim.engine.cancel(self.compute_event)
        self.sim.engine.cancel(self.heartbeat_event)
        self.compute_event = self.heartbeat_event = None
        self.link, self.conn_id, self.connected = None, None, False
        self.task, self.reasm = None, None

    def closed_by_server(self, conn_id: str, final: bool) -> None:
        if conn_id != self.conn_id:
            return
        if self.link is not None:
            self.sim.stats.frames_lost += self.link.drop()
        self._teardown()
        if final:
            self.gone = True
            self.lifecycle.stop()
        else:
            # Refused or closed for misbehaviour: try again after a rejoin delay.
            self.lifecycle.stop()
            rejoin = self.sim.scenario.clients.churn.rejoin
            if rejoin is not None:
                self.sim.engine.schedule(
                    rejoin.sample(self.rng), self.connect, priority=Priority.CHURN
                )

    # -- protocol ------------------------------------------------------------------

    def on_message(self, conn_id: str, msg: m.Message) -> None:
        if conn_id != self.conn_id:
            return  # a frame for a connection that no longer exists
        match msg:
            case m.Welcome():
                self.resume = msg.resume_token or None
                self.heartbeat_interval = msg.heartbeat_interval
                self.max_frame = msg.limits.max_message_bytes
                self._schedule_heartbeat()
            case m.Task():
                self.sim.engine.cancel(self.compute_event)
                self.compute_event = None
                self.task = msg
                if msg.model_transfer is not None:
                    self.reasm = Reassembler.for_params(
                        msg.spec, transfer=msg.model_transfer, total=msg.num_chunks
                    )
                else:
                    self.reasm = None
                    self._start_compute()
            case m.Chunk():
                if self.reasm is None or msg.transfer != self.reasm.transfer:
                    return
                self.reasm.add(msg)
                if self.reasm.done and self.task is not None:
                    self.held = self.reasm.params()
                    self.held_version = self.task.model_version
                    self.reasm = None
                    self._start_compute()
            case m.Ack() | m.Heartbeat() | m.Error() | m.Bye():
                pass
            case _:
                log.debug("player %d ignores %s", self.index, msg.TYPE)

    def _schedule_heartbeat(self) -> None:
        self.heartbeat_event = self.sim.engine.schedule(
            self.heartbeat_interval, self._heartbeat, priority=Priority.COMPUTE
        )

    def _heartbeat(self) -> None:
        self._up(m.Heartbeat(seq=self.session, time=self.sim.engine.now))
        self._schedule_heartbeat()

    def _start_compute(self) -> None:
        task = self.task
        assert task is not None
        if self.held is None or self.held_version != task.model_version:
            return  # cannot compute: a base it does not hold (the core should not ask)
        spec = task.spec
        flops = spec.flops_per_sample(train=True) * task.steps * task.batch
        seconds = flops / self.flops
        self.compute_event = self.sim.engine.schedule(
            seconds, self._compute_done, task, seconds, priority=Priority.COMPUTE
        )

    def _compute_done(self, task: m.Task, seconds: float) -> None:
        self.compute_event = None
        if self.held is None:
            return
        out = run_task(task, self.held, self.sim.dataset)
        update = Params.from_flat(task.spec, out.update.astype(np.float32, copy=False), copy=False)
        chunks = chunk_params(
            update,
            max_message_bytes=self.max_frame,
            codec=task.upload_codec,
            transfer=task.task_id,
            rng=self.rng,
        )
        self.sim.steps_of[(self.conn_id, task.task_id)] = out.steps
        result = m.Result(
            task_id=task.task_id,
            model_version=task.model_version,
            kind=task.kind,
            num_chunks=len(chunks),
            loss=out.loss,
            samples=out.samples,
            steps=out.steps,
            compute_seconds=seconds,
        )
        copies = 2 if self.rng.random() < self.sim.scenario.clients.duplicate_results else 1
        for _ in range(copies):  # a duplicate follows the complete first upload
            self._up(result)
            for ch in chunks:
                self._up(ch)


class Simulation:
    """One scenario point, run to its stop condition; ``run()`` returns its RunResult."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        label: str = "",
        point: dict[str, Any] | None = None,
        progress: Callable[[float, float], None] | None = None,
        dataset: Dataset | None = None,
        observer: Callable[[Simulation, list[ev.Output]], None] | None = None,
    ) -> None:
        if scenario.run.mode != "numeric":
            raise ValueError("driver: this driver runs numeric scenarios; use the cost model")
        self.scenario = scenario
        self.label = label or scenario.name
        self.point = point or {}
        self.progress = progress
        self.observer = observer
        self.job = scenario.job
        self.engine = Engine(seed=scenario.seed)
        self.limits = scenario.limits
        self.link_spec = scenario.link
        self.dataset = dataset or load_dataset(self.job.data.dataset, seed=self.job.data.seed)
        self.core = Coordinator(self.job, seed=scenario.seed, dataset=self.dataset)
        self.stats = Stats()
        self.series: list[Sample] = []
        self.by_conn: dict[str, Player] = {}
        self.steps_of: dict[tuple[str | None, str], int] = {}
        self.tick_event: Event | None = None
        self.last_tick = -math.inf
        self.done = False
        self.stop_reason = ""
        stop = self.job.stop
        self.horizon = min(stop.max_time_s or math.inf, scenario.run.max_virtual_s)
        self.players = [Player(self, i) for i in range(scenario.clients.count)]

    # -- running -------------------------------------------------------------------

    def run(self) -> RunResult:
        join = self.engine.rng("joins")
        spread = self.scenario.clients.join_over_s
        for p in self.players:
            t = float(join.uniform(0.0, spread)) if spread > 0 else 0.0
            self.engine.schedule_at(t, self._first_join, p, priority=Priority.CHURN)
        self.engine.schedule_at(0.0, self._sample, priority=Priority.CONTROL)
        self._arm_tick(0.0)
        self.engine.run_until(self.horizon, until=lambda: self.done)
        if not self.done:
            self._stop("max_time" if self.engine.now >= self.horizon else "idle")
        return self._result()

    def _first_join(self, p: Player) -> None:
        p.connect()
        p.lifecycle.start()

    def _stop(self, reason: str) -> None:
        if self.done:
            return
        self.done = True
        self.stop_reason = reason
        self._sample(reschedule=False)

    # -- the coordinator side ------------------------------------------------------

    def at_server(self, p: Player, conn_id: str, msg: m.Message, nbytes: int, first: bool) -> None:
        if self.done:
            return
        now = self.engine.now
        if first:
            assert isinstance(msg, m.Hello)
            self.by_conn[conn_id] = p
            p.connected = True
            out = self.core.connect(conn_id, msg, now)
        elif conn_id in self.core.conns:
            out = self.core.receive(conn_id, msg, now, nbytes=nbytes)
        else:
            return  # the core closed it already; the frame was in flight
        self._apply(out)

    def disconnect(self, conn_id: str, reason: str) -> None:
        if not self.done:
            self._apply(self.core.disconnect(conn_id, self.engine.now, reason))

    def _tick(self) -> None:
        self.tick_event = None
        self.last_tick = self.engine.now
        if not self.done:
            self._apply(self.core.tick(self.engine.now))

    def _arm_tick(self, at: float) -> None:
        # A wakeup at or before the last tick's time could repeat forever if the
        # core's own check rounds differently from next_wakeup() (seen: an orphan
        # grace of orphaned_at + grace vs now - orphaned_at >= grace). 1 µs later
        # is harmless and guarantees virtual time moves.
        if at <= self.last_tick:
            at = self.last_tick + TICK_GUARD_S
        if self.tick_event is not None and self.tick_event.time <= at:
            return
        self.engine.cancel(self.tick_event)
        self.tick_event = self.engine.schedule_at(
            max(at, self.engine.now), self._tick, priority=Priority.TICK
        )

    def _apply(self, outputs: list[ev.Output]) -> None:
        if self.observer is not None:
            self.observer(self, outputs)
        for o in outputs:
            self.stats.events[type(o).__name__] = self.stats.events.get(type(o).__name__, 0) + 1
            match o:
                case ev.Send():
                    self._send_down(o)
                case ev.Close():
                    self._close(o)
                case ev.ResultAccepted():
                    self.stats.results_accepted += 1
                    self.stats.steps += self.steps_of.pop((o.client_id, str(o.task_id)), 0)
                case ev.ResultRejected():
                    self.stats.results_rejected += 1
                case ev.LeaseExpired():
                    self.stats.leases_expired += 1
                case ev.ModelUpdated():
                    self.stats.version = o.version
                case ev.Evaluated():
                    self.stats.loss, self.stats.accuracy = o.loss, o.accuracy
                    target = self.job.stop.target_accuracy
                    if (
                        target is not None
                        and o.accuracy >= target
                        and self.stats.time_to_target is None
                    ):
                        self.stats.time_to_target = o.now
                case ev.JobFinished():
                    self.stats.finished = o.reason
                    self._stop(o.reason)
                case _:
                    pass
        max_steps = self.scenario.run.max_steps
        if max_steps is not None and self.stats.steps >= max_steps:
            self._stop("max_steps")
        if not self.done:
            wake = self.core.next_wakeup()
            nxt = self.engine.now + self.scenario.run.tick_every_s
            self._arm_tick(min(wake, nxt) if wake is not None else nxt)

    def _send_down(self, send: ev.Send) -> None:
        p = self.by_conn.get(send.client_id)
        if p is None or p.conn_id != send.client_id or p.link is None:
            return  # the player is gone; the write goes nowhere
        nbytes = len(send.frame) if send.frame else len(m.encode(send.message))
        self.stats.bytes_down += nbytes
        p.link.send(
            up=False, nbytes=nbytes, on_delivery=p.on_message, args=(send.client_id, send.message)
        )

    def _close(self, close: ev.Close) -> None:
        self.stats.closes += 1
        p = self.by_conn.get(close.client_id)
        if p is None or p.conn_id != close.client_id or p.link is None:
            return
        final = self.core.finished is not None
        at = max(self.engine.now, p.link.down._last_delivery)
        self.engine.schedule_at(
            at, p.closed_by_server, close.client_id, final, priority=Priority.DELIVERY
        )

    # -- metrics -------------------------------------------------------------------

    def _sample(self, reschedule: bool = True) -> None:
        s = self.stats
        self.series.append(
            Sample(
                t=self.engine.now,
                version=s.version,
                steps=s.steps,
                loss=s.loss,
                accuracy=s.accuracy,
                bytes_up=s.bytes_up,
                bytes_down=s.bytes_down,
                clients_online=len(self.core.conns),
            )
        )
        if self.progress is not None:
            self.progress(self.engine.now, self.horizon)
        if reschedule and not self.done:
            self.engine.schedule(
                self.scenario.run.sample_every_s, self._sample, priority=Priority.CONTROL
            )

    def _result(self) -> RunResult:
        s = self.stats
        sc = self.scenario
        elapsed = self.engine.now
        spec = self.job.spec
        step_flops = spec.flops_per_sample(train=True) * self.job.data.batch
        target = self.job.stop.target_accuracy
        if sc.run.max_steps is not None:
            linear_steps: int | None = sc.run.max_steps
            ours = elapsed if self.stop_reason == "max_steps" else None
        elif target is not None:
            linear_steps = linear_steps_to_target(self.job, self.dataset, target)
            ours = s.time_to_target
        else:
            linear_steps, ours = None, None
        linear_s = linear_steps * step_flops / sc.server.compute if linear_steps else None
        players = max(1, sc.clients.count)
        summary = {
            "mode": sc.run.mode,
            "reason": self.stop_reason,
            "virtual_seconds": elapsed,
            "seconds": ours,
            "steps": s.steps,
            "versions": s.version,
            "loss": s.loss,
            "accuracy": s.accuracy,
            "time_to_target": s.time_to_target,
            "linear_steps": linear_steps,
            "linear_seconds": linear_s,
            "speedup": linear_s / ours if linear_s and ours else None,
            "bytes_up": s.bytes_up,
            "bytes_down": s.bytes_down,
            "bytes_per_client": (s.bytes_up + s.bytes_down) / players,
            "results_accepted": s.results_accepted,
            "results_rejected": s.results_rejected,
            "leases_expired": s.leases_expired,
            "drops": s.drops,
            "frames_lost": s.frames_lost,
            "closes": s.closes,
            "events_run": self.engine.events_run,
        }
        return RunResult(
            label=self.label,
            point=self.point,
            scenario=sc.to_dict(),
            summary=summary,
            series=self.series,
        )


def linear_steps_to_target(
    job: Any, dataset: Dataset, target: float, *, max_steps: int = 20_000
) -> int | None:
    """Mini-batch steps one machine needs to reach ``target`` test accuracy, or None.

    The same model, optimizer and batch as the job's clients, trained on the whole
    training set, evaluated as often as the job's coordinator would (every tau steps).
    """
    spec = job.spec
    params = spec.init_params(job.model.init_seed)
    s = job.strategy
    opt = Optimizer.from_dict({"kind": s.client_optimizer, "lr": s.lr, "momentum": s.momentum})
    state = OptState.init(opt, spec)
    rng = np.random.default_rng(job.data.seed)
    every = max(1, s.tau)
    done = 0
    while done < max_steps:
        train_steps(params, state, dataset.X_train, dataset.y_train, every, job.data.batch, rng)
        done += every
        if evaluate(params, dataset.X_test, dataset.y_test).accuracy >= target:
            return done
    return None


def run_scenario(
    scenario: Scenario,
    *,
    label: str = "",
    point: dict[str, Any] | None = None,
    progress: Callable[[float, float], None] | None = None,
) -> RunResult:
    """Run one scenario point with the driver its mode needs."""
    if scenario.run.mode == "cost":
        from simulations.costmodel import run_cost

        return run_cost(scenario, label=label, point=point, progress=progress)
    return Simulation(scenario, label=label, point=point, progress=progress).run()
