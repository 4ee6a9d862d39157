"""The simulator's driver: the real Coordinator and real numerics in virtual time.

Theory of operation. The engine owns the clock. Every player is a
:class:`~simulations.player.Player` (simulations/player.py): a compute rate
drawn once, a churn :class:`~simulations.churn.Lifecycle`, and per connection a
:class:`~simulations.network.Link` and a fresh connection id
(``p<i>.<session>``). Everything the coordinator says (``Send``) goes down the
player's link as its exact frame size and is handled by the player when it
lands; everything a player says goes up its link and is fed to
``Coordinator.receive`` when it lands. Nothing is decoded on the way: the
objects travel, their encoded sizes set the timing. The driver only models
links, compute time and churn.

Faults: a churn drop kills the link (frames in flight are lost) and the
coordinator hears ``disconnect`` one latency later, or never for a "silent"
drop (then only its heartbeat timeout notices). A coordinator ``Close`` ends the
connection after the frames already sent have landed. ``clients.duplicate_results``
makes the transport repeat a whole upload (result and chunks) once.

The coordinator is ticked at its own ``next_wakeup()`` (pacing, leases,
heartbeats) and at least every ``run.tick_every_s``.
"""

from __future__ import annotations

import gc
import logging
import math
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numba
import numpy as np

from coordinator.core import events as ev
from coordinator.core.assembly import build_core
from coordinator.core.data import load_job_data
from coordinator.core.machine import Coordinator
from nn.data import Dataset
from nn.mapped import MAP_ABOVE_PARAMS, create_mapped
from protocol import messages as m
from protocol.volunteer import volunteer_id
from simulations.engine import Engine, Event, Priority, stream_seed
from simulations.linear import linear_steps_to_target
from simulations.player import Player, Stats, player_key
from simulations.report import RunResult, Sample, run_summary
from simulations.scenario import Scenario

log = logging.getLogger(__name__)

T = TypeVar("T")

#: GIL switch interval while a simulation runs with its numerics thread (see run)
SWITCH_INTERVAL_S = 1e-4
#: young-generation gc threshold while a simulation runs (see run)
GC_THRESHOLD0 = 50_000


class _Inline(Executor):
    """An executor that runs each call at once, in the caller's thread."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except Exception as exc:  # delivered by result(), where the thread's would be
            fut.set_exception(exc)
        return fut


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
        overlap: bool = False,
        engine: Engine | None = None,
        core: Coordinator | None = None,
        players: Sequence[int] | None = None,
    ) -> None:
        """``engine``, ``core`` and ``players`` (indices into the scenario's crowd)
        let several simulations share one clock, each with its own coordinator and
        share of the crowd (simulations/federation.py); by default one engine, a
        coordinator running the scenario's job, and every player."""
        if scenario.run.mode != "numeric":
            raise ValueError("driver: this driver runs numeric scenarios; use the cost model")
        self.scenario = scenario
        self.label = label or scenario.name
        self.point = point or {}
        self.progress = progress
        self.observer = observer
        self.overlap = overlap
        self.job = scenario.job if core is None else core.job
        self.engine = engine or Engine(seed=scenario.seed)
        self.limits = scenario.limits
        self.link_spec = scenario.link
        self.dataset = dataset or load_job_data(self.job)
        #: a model too big to allocate lives in a mapped temporary file (nn/mapped.py)
        self._mapped: tempfile.TemporaryDirectory[str] | None = None
        self.core = core or self._coordinator(scenario)
        self.stats = Stats()
        self.series: list[Sample] = []
        self.by_conn: dict[str, Player] = {}
        self.steps_of: dict[str, int] = {}
        self.tick_event: Event | None = None
        self._numerics: Executor | None = None
        self.done = False
        self.stop_reason = ""
        stop = self.job.stop
        self.horizon = min(stop.max_time_s or math.inf, scenario.run.max_virtual_s)
        # Drawn from the scenario's seed, not this engine's streams: each share of a
        # crowd split over coordinators draws the same Byzantine set and join times.
        attack = scenario.clients.attack
        self.byzantine = (
            attack.spec().byzantine(scenario.clients.count, _stream(scenario, "byzantine"))
            if attack is not None
            else frozenset()
        )
        indices = range(scenario.clients.count) if players is None else players
        self.players = [Player(self, i) for i in indices]

    # -- running -------------------------------------------------------------------

    def _coordinator(self, scenario: Scenario) -> Coordinator:
        spec = self.job.spec
        if spec.num_params <= MAP_ABOVE_PARAMS:
            return build_core(self.job, seed=scenario.seed, dataset=self.dataset)
        # In memory-backed /dev/shm when it has room: every merge dirties its
        # slice's pages, and a disk's writeback would throttle the simulation.
        shm = Path("/dev/shm")
        room = shm.is_dir() and shutil.disk_usage(shm).free > 1.1 * spec.nbytes
        self._mapped = tempfile.TemporaryDirectory(
            prefix="crowdgrad-model-", dir=shm if room else None
        )
        path = Path(self._mapped.name) / "model.f32"
        log.info("%s: %.1f GB of parameters mapped from %s", scenario.name, spec.nbytes / 1e9, path)
        params = create_mapped(path, spec, self.job.model.init_seed)
        return build_core(self.job, params, scenario.seed, dataset=self.dataset, share_params=True)

    def run(self) -> RunResult:
        self.start()
        with tuned_runtime(overlap=self.overlap):
            try:
                self.engine.run_until(self.horizon, until=lambda: self.done)
            finally:
                self.close()
        return self.finish()

    def start(self) -> None:
        """Schedule the players' first joins, the sampling and the first tick."""
        spread = self.scenario.clients.join_over_s
        join = _stream(self.scenario, "joins")
        count = self.scenario.clients.count
        at = [float(join.uniform(0.0, spread)) for _ in range(count)] if spread > 0 else None
        for p in self.players:
            t = at[p.index] if at is not None else 0.0
            self.engine.schedule_at(t, self._first_join, p, priority=Priority.CHURN)
        self.engine.schedule_at(self.engine.now, self._sample, priority=Priority.CONTROL)
        self._arm_tick(self.engine.now)

    def finish(self, reason: str | None = None) -> RunResult:
        """Stop (for ``reason``, if no stop condition did) and summarize."""
        if not self.done:
            self._stop(reason or ("max_time" if self.engine.now >= self.horizon else "idle"))
        return self._result()

    @property
    def numerics(self) -> Executor:
        """What runs the players' ``run_task`` calls: inline in the calling thread
        (the default), or with ``overlap=True`` one worker thread.

        Why the option: the numba kernel releases the GIL, so a computation
        started when the session asks for it can overlap the event loop on a free
        core until its virtual completion comes due. Measured on the shared
        2-core machine it lost (GIL hand-offs cost more than the overlap saved
        with the other core busy; docs/simulations.md), hence not the default.
        Each result depends only on its task, base model and dataset, never on
        timing, so runs are bitwise the same either way (test_driver.py).
        """
        if self._numerics is None and not self.overlap:
            self._numerics = _Inline()
        if self._numerics is None:
            n = numba.get_num_threads()  # numba's count is per thread: carry it over
            self._numerics = ThreadPoolExecutor(
                1, thread_name_prefix="sim-numerics", initializer=numba.set_num_threads,
                initargs=(n,),
            )  # fmt: skip
        return self._numerics

    def close(self) -> None:
        """Stop the numerics thread (``run`` does; callers that step the engine may)."""
        if self._numerics is not None:
            self._numerics.shutdown(wait=True, cancel_futures=True)
            self._numerics = None

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

    def act(self, fn: Callable[[Coordinator, float], tuple[T, list[ev.Output]]]) -> T:
        """``fn(core, now)`` on this coordinator, its outputs delivered (what
        ``CoreService.act`` is to a server): an edge's uplink rebasing it."""
        value, out = fn(self.core, self.engine.now)
        self._apply(out)
        return value

    def disconnect(self, conn_id: str, reason: str) -> None:
        if not self.done:
            self._apply(self.core.disconnect(conn_id, self.engine.now, reason))

    def _tick(self) -> None:
        self.tick_event = None
        if not self.done:
            self._apply(self.core.tick(self.engine.now))

    def _arm_tick(self, at: float) -> None:
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
                    steps = self.steps_of.pop(str(o.task_id), 0)
                    if o.replica:
                        self.stats.replica_steps += steps
                    else:
                        self.stats.steps += steps
                case ev.ResultRejected():
                    self.stats.results_rejected += 1
                case ev.LeaseExpired():
                    self.stats.leases_expired += 1
                case ev.TaskLeased():
                    self.stats.tasks_prefetched += o.queued
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
        if p is not None and p.attacker is None and self.core.finished is None:
            self.stats.honest_closes += 1
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

    def _credit(self) -> dict[str, float]:
        """Credit granted (and pending) to honest and to Byzantine players, in FLOPs."""
        ids = {
            volunteer_id(player_key(self.scenario.seed, i)): i in self.byzantine
            for i in range(self.scenario.clients.count)
        }
        out = dict.fromkeys(
            ("credit_honest_flops", "credit_byzantine_flops", "credit_byzantine_pending"), 0.0
        )
        for acct in self.core.credit.accounts.values():
            if ids.get(acct.volunteer):
                out["credit_byzantine_flops"] += acct.flops
                out["credit_byzantine_pending"] += acct.pending
            else:
                out["credit_honest_flops"] += acct.flops
        return out

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
        summary = run_summary(
            mode=sc.run.mode,
            reason=self.stop_reason,
            virtual_seconds=elapsed,
            seconds=ours,
            steps=s.steps,
            versions=s.version,
            loss=s.loss,
            accuracy=s.accuracy,
            time_to_target=s.time_to_target,
            linear_steps=linear_steps,
            linear_seconds=linear_s,
            bytes_up=s.bytes_up,
            bytes_down=s.bytes_down,
            players=sc.clients.count,
        ) | {
            "results_accepted": s.results_accepted,
            "results_rejected": s.results_rejected,
            "leases_expired": s.leases_expired,
            "tasks_prefetched": s.tasks_prefetched,
            "drops": s.drops,
            "frames_lost": s.frames_lost,
            "closes": s.closes,
            "honest_closes": s.honest_closes,
            "byzantine": len(self.byzantine),
            "hijacks_sent": s.hijacks_sent,
            "events_run": self.engine.events_run,
        }
        if sc.clients.volunteers:
            summary |= self._credit()
        if self.job.replication.enabled:
            rep = self.core.verifier.summary()
            summary |= {"replica_steps": s.replica_steps} | {
                f"replication_{k}": rep[k] for k in ("agreed", "disagreed", "excluded", "overhead")
            }
        return RunResult(
            label=self.label,
            point=self.point,
            scenario=sc.to_dict(),
            summary=summary,
            series=self.series,
        )


@contextmanager
def tuned_runtime(*, overlap: bool) -> Iterator[None]:
    """The interpreter settings a simulation runs under, restored afterwards."""
    # The numerics thread needs the GIL twice per task; at the default 5 ms
    # switch interval it would wait behind the event loop, not overlap it.
    interval = sys.getswitchinterval()
    if overlap:
        sys.setswitchinterval(SWITCH_INTERVAL_S)
    # Every result allocates a few hundred short-lived containers; at the
    # default threshold (700) the young-generation collections cost ~10 %.
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], GC_THRESHOLD0), *thresholds[1:])
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*thresholds)


def _stream(scenario: Scenario, name: str) -> np.random.Generator:
    """Stream ``name`` of the scenario's seed (what ``Engine.rng`` gives on first use)."""
    return np.random.default_rng(stream_seed(scenario.seed, name))
