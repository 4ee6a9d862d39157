"""The simulator's driver: the real Coordinator and real numerics in virtual time.

Theory of operation. The engine owns the clock. Every player is a
:class:`Player`: a compute rate drawn once, a churn :class:`Lifecycle`, and per
connection a :class:`~simulations.network.Link` and a fresh connection id
(``p<i>.<session>``). Everything the coordinator says (``Send``) goes down the
player's link as its exact frame size and is handled by the player when it
lands; everything a player says goes up its link and is fed to
``Coordinator.receive`` when it lands. Nothing is decoded on the way: the
objects travel, their encoded sizes set the timing.

A player does not speak the protocol itself: it drives the real
:class:`client.session.ClientSession` (one per player, kept across connections,
like a tab that reconnects) and carries out its actions. ``Send`` goes up the
link; a ``ComputeRequest`` starts ``client.compute.run_task`` (inline, or on a
numerics thread: ``Simulation.numerics``) and hands the update to
``compute_done`` ``FLOPs / rate`` virtual seconds later; ``Finished`` retires
the player. The session is ticked at its own ``next_wakeup()`` (heartbeats,
paced frames), and asked to ``prefetch`` at its own ``prefetch_delay()`` into
each compute (``clients.prefetch``). The driver only models links, compute time
and churn.

Faults: a churn drop kills the link (frames in flight are lost) and the
coordinator hears ``disconnect`` one latency later, or never for a "silent"
drop (then only its heartbeat timeout notices). A coordinator ``Close`` ends the
connection after the frames already sent have landed. A dropped player keeps
computing; the session sends the finished result after it rejoins with its
resume token. ``clients.duplicate_results`` makes the transport repeat a whole
upload (result and chunks) once.

The coordinator is ticked at its own ``next_wakeup()`` (pacing, leases,
heartbeats) and at least every ``run.tick_every_s``.

Why long: players, links and churn around the real core in one event loop;
the attack behaviours, federation, network and churn models have their
own modules.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numba
import numpy as np

from client.compute import ComputeOutput, run_task
from client.datacache import MemoryCache
from client.session import (
    Action,
    Capabilities,
    ClientSession,
    ComputeRequest,
    Finished,
    Phase,
    Send,
)
from coordinator.core import events as ev
from coordinator.core.assembly import build_core
from coordinator.core.data import load_job_data
from coordinator.core.machine import Coordinator
from coordinator.core.strategies.aggregate import schedule_factor
from nn.data import Dataset
from nn.mapped import MAP_ABOVE_PARAMS, create_mapped
from nn.optim import Optimizer, OptState
from nn.params import Params
from nn.train import evaluate, train_steps
from protocol import messages as m
from protocol.chunking import chunk_params
from simulations.attacks import Attacker
from simulations.churn import Lifecycle
from simulations.engine import Engine, Event, Priority, stream_seed
from simulations.network import Link
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


@dataclass(slots=True)
class Stats:
    steps: int = 0
    #: steps of twins' results (replication): compute spent checking, not progress
    replica_steps: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    frames_lost: int = 0
    drops: int = 0
    results_accepted: int = 0
    results_rejected: int = 0
    leases_expired: int = 0
    tasks_prefetched: int = 0
    closes: int = 0
    #: closes of honest players (a robust job closes none), forged results sent
    honest_closes: int = 0
    hijacks_sent: int = 0
    version: int = 0
    loss: float | None = None
    accuracy: float | None = None
    time_to_target: float | None = None
    finished: str | None = None
    events: dict[str, int] = field(default_factory=dict)


class Player:
    """One simulated client: a real :class:`ClientSession` plus a link, a compute
    rate and a churn lifecycle (see the module docstring)."""

    #: its random stream is ``<STREAM>/<index>``, its connections ``<CONN><index>.<n>``
    #: (another kind of client on the same engine takes its own: simulations/federation.py)
    STREAM = "player"
    CONN = "p"

    def __init__(self, sim: Simulation, index: int) -> None:
        self.sim = sim
        self.index = index
        self.rng = sim.engine.rng(f"{self.STREAM}/{index}")
        self.flops = max(1.0, sim.scenario.clients.sample_flops(self.rng))
        # every codec of the job, the delta codec too: a client offers what it decodes
        # (the coordinator sends deltas only to a client that lists their codec)
        job_codecs = (sim.job.codecs.model, sim.job.codecs.update, sim.job.codecs.delta)
        codecs = tuple(sorted({c for c in job_codecs if c is not None}))
        cache = MemoryCache()  # a player's shards outlive its reconnects
        if sim.scenario.clients.warm_data:
            for shard in sim.core.data.shards:
                cache.put(shard.sha256, shard.blob)
        #: this player's lie, if the scenario made it Byzantine
        self.attacker = (
            Attacker(sim.scenario.clients.attack.spec(), sim.engine.rng(f"attack/{index}"))
            if index in sim.byzantine
            else None
        )
        self.client = ClientSession(
            f"player-{index}",
            Capabilities(
                flops=self.flops,
                limits=sim.limits,
                codecs=codecs,
                prefetch=sim.scenario.clients.prefetch,
            ),
            seed=int(self.rng.integers(2**32)),
            cache=cache,
        )
        self.session = 0
        self.conn_id: str | None = None
        self.link: Link | None = None
        self.connected = False  # the coordinator knows this connection
        self.compute_event: Event | None = None
        self.compute_job: Future[ComputeOutput] | None = None
        self.prefetch_event: Event | None = None
        self.wake_event: Event | None = None
        self.gone = False  # left for good (job over)
        # a duplicated upload being collected: its task id, chunks to come, frames
        self._dup_task: str | None = None
        self._dup_left = 0
        self._dup_frames: list[tuple[m.Message, int]] = []
        self.lifecycle = Lifecycle(
            sim.engine,
            sim.scenario.clients.churn,
            name=str(index),
            on_leave=self.drop,
            on_join=self.connect,
        )

    # -- connection ----------------------------------------------------------------

    def connect(self) -> None:
        if self.gone or self.sim.done or self.client.phase is Phase.FINISHED:
            return
        self.session += 1
        self.conn_id = f"{self.CONN}{self.index}.{self.session}"
        self.link = Link(self.sim.engine, self.sim.link_spec, name=self.conn_id)
        self._dup_task = None
        self._do(self.client.start(self.sim.engine.now))

    def drop(self) -> None:
        """Churn: the player's connection vanishes now, mid-whatever."""
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
        """The socket is gone; the session keeps its model, computation and result."""
        self.link, self.conn_id, self.connected = None, None, False
        self._dup_task = None
        if self.client.phase in (Phase.HELLO_SENT, Phase.READY):
            self.client.connection_lost(self.sim.engine.now)
        self._arm_wakeup()

    def closed_by_server(self, conn_id: str, final: bool) -> None:
        if conn_id != self.conn_id:
            return
        if self.link is not None:
            self.sim.stats.frames_lost += self.link.drop()
        self._teardown()
        self.lifecycle.stop()
        if final or self.client.phase is Phase.FINISHED:
            self._retire()
            return
        # Refused, timed out or closed for misbehaviour: try again after a rejoin delay.
        rejoin = self.sim.scenario.clients.churn.rejoin
        if rejoin is not None:
            self.sim.engine.schedule(rejoin.sample(self.rng), self.connect, priority=Priority.CHURN)

    def _retire(self) -> None:
        self.gone = True
        self.lifecycle.stop()
        self._cancel_compute()
        self.sim.engine.cancel(self.wake_event)
        self.wake_event = None

    # -- the session's actions -----------------------------------------------------

    def on_message(self, conn_id: str, msg: m.Message) -> None:
        if conn_id != self.conn_id or self.client.phase not in (Phase.HELLO_SENT, Phase.READY):
            return  # a frame for a connection that no longer exists
        self._do(self.client.receive(msg, self.sim.engine.now))

    def _wake(self) -> None:
        self.wake_event = None
        self._do(self.client.tick(self.sim.engine.now), ticked=True)

    def _do(self, actions: list[Action], *, ticked: bool = False) -> None:
        for a in actions:
            match a:
                case Send():
                    self._up(a.message, len(a.frame))
                case ComputeRequest():
                    self._compute(a)
                case Finished():
                    self._retire()
        if not self.gone:
            self._arm_wakeup(ticked=ticked)

    def _arm_wakeup(self, *, ticked: bool = False) -> None:
        at = self.client.next_wakeup()
        now = self.sim.engine.now
        tol = 1e-9 * max(1.0, abs(now))  # Pacer.consume's own round-off allowance
        if ticked and at is not None and at < now + tol:
            # A tick just ran and the session still wants one "now": the pacer's
            # next_send_time can land a few ulps before the instant try_consume
            # accepts, so wake a nanosecond later instead of repeating forever.
            at = now + tol
        ev = self.wake_event
        if ev is not None and not ev.cancelled and at is not None and ev.time == at:
            return
        self.sim.engine.cancel(ev)
        self.wake_event = None
        if at is not None:
            self.wake_event = self.sim.engine.schedule_at(
                max(at, now), self._wake, priority=Priority.COMPUTE
            )

    def _up(self, msg: m.Message, nbytes: int, *, replay: bool = False) -> None:
        link, conn_id = self.link, self.conn_id
        if link is None or conn_id is None:
            return
        self.sim.stats.bytes_up += nbytes
        link.send(
            up=True,
            nbytes=nbytes,
            on_delivery=self.sim.at_server,
            args=(self, conn_id, msg, nbytes, isinstance(msg, m.Hello)),
        )
        if not replay:
            self._maybe_duplicate(msg, nbytes)

    def _maybe_duplicate(self, msg: m.Message, nbytes: int) -> None:
        """Fault: the transport repeats a whole upload (result and chunks) once."""
        if isinstance(msg, m.Result):
            self._dup_task = None
            if self.rng.random() < self.sim.scenario.clients.duplicate_results:
                self._dup_task, self._dup_left = msg.task_id, msg.num_chunks
                self._dup_frames = [(msg, nbytes)]
            return
        if not isinstance(msg, m.Chunk) or msg.transfer != self._dup_task:
            return
        self._dup_frames.append((msg, nbytes))
        self._dup_left -= 1
        if self._dup_left == 0:
            self._dup_task = None
            for again, size in self._dup_frames:
                self._up(again, size, replay=True)

    def _compute(self, req: ComputeRequest) -> None:
        # A newer request supersedes a running one (the session ignores the old result).
        self._cancel_compute()
        task = req.task
        flops = task.spec.flops_per_sample(train=True) * task.steps * task.batch
        seconds = flops / self.flops
        # The numbers are computed now (or start on the numerics thread); the
        # virtual compute time only decides when the session hears of them.
        data = req.data if task.data is not None else self.sim.dataset
        compute = run_task if self.attacker is None else self.attacker.compute
        self.compute_job = self.sim.numerics.submit(compute, task, req.params, data)
        self.compute_event = self.sim.engine.schedule(
            seconds, self._compute_done, req, seconds, priority=Priority.COMPUTE
        )
        # When to ask for the next task is the session's estimate, from the last
        # compute and download, as a real client would make it (not `seconds`).
        delay = self.client.prefetch_delay()
        if delay is not None and delay < seconds:
            self.prefetch_event = self.sim.engine.schedule(
                delay, self._prefetch, req.request_id, priority=Priority.COMPUTE
            )

    def _prefetch(self, request_id: int) -> None:
        self.prefetch_event = None
        self._do(self.client.prefetch(self.sim.engine.now, request_id))

    def _hijack(self, task: m.Task) -> None:
        """Upload a zero update under the next task id: another player's, likely."""
        if not task.task_id.isdigit() or self.client.limits is None:
            return
        forged = str(int(task.task_id) + 1)
        chunks = chunk_params(
            Params.zeros(task.spec),
            max_message_bytes=self.client.limits.max_message_bytes,
            codec=task.upload_codec,
            transfer=forged,
            target_bytes=self.client.limits.frame_bytes,
        )
        result = m.Result(task_id=forged, model_version=task.model_version, num_chunks=len(chunks))
        self._do([Send(message=msg, frame=m.encode(msg)) for msg in (result, *chunks)])
        self.sim.stats.hijacks_sent += 1

    def _cancel_compute(self) -> None:
        self.sim.engine.cancel(self.compute_event)
        self.sim.engine.cancel(self.prefetch_event)
        if self.compute_job is not None:
            self.compute_job.cancel()  # a no-op once it runs; its result is ignored
        self.compute_event = self.compute_job = self.prefetch_event = None

    def _compute_done(self, req: ComputeRequest, seconds: float) -> None:
        job = self.compute_job
        assert job is not None
        self.sim.engine.cancel(self.prefetch_event)
        self.compute_event = self.compute_job = self.prefetch_event = None
        out = job.result()
        self.sim.steps_of[req.task.task_id] = out.steps
        if self.attacker is not None and self.attacker.hijacks:
            self._hijack(req.task)
        self._do(
            self.client.compute_done(
                req.request_id,
                out.update,
                self.sim.engine.now,
                loss=out.loss,
                samples=out.samples,
                steps=out.steps,
                compute_seconds=seconds,
                boundary=out.boundary,
            )
        )


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


def linear_evaluations(
    job: Any,
    dataset: Dataset,
    *,
    max_steps: int = 20_000,
    lr: float | None = None,
    batch: int | None = None,
    every: int | None = None,
) -> Iterator[tuple[int, Any]]:
    """One machine training the job alone: ``(steps done, evaluation)`` every tau steps.

    The same model, optimizer and batch as the job's clients, trained on the whole
    training set, evaluated on the coordinator's held-out rows as often as the
    job's coordinator would (every tau steps, or ``every``; each stretch draws its
    batches afresh, as a client's task does), up to ``max_steps``.
    ``lr`` and ``batch`` replace the job's: an anchor runs at its own best
    settings, and a batch of players × the job's batch is the ideal synchronous
    crowd. The job's ``strategy.schedule`` multiplies the lr, one step counting as
    one version, set at the start of each stretch: the anchor may warm up too.
    """
    spec = job.spec
    params = spec.init_params(job.model.init_seed)
    s = job.strategy
    opt = Optimizer.from_dict(
        {"kind": s.client_optimizer, "lr": s.lr if lr is None else lr, "momentum": s.momentum}
    )
    state = OptState.init(opt, spec)
    rng = np.random.default_rng(job.data.seed)
    n = job.eval.max_samples or dataset.X_test.shape[0]
    every = max(1, s.nominal_tau if every is None else every)
    schedule = s.schedule.model_dump()
    done = 0
    while done < max_steps:
        size = job.data.batch if batch is None else batch
        if schedule["kind"] != "constant":
            factor = schedule_factor(done, **schedule)
            state.optimizer = dataclasses.replace(opt, lr=opt.lr * factor)
        train_steps(params, state, dataset.X_train, dataset.y_train, every, size, rng)
        done += every
        yield done, evaluate(params, dataset.X_test[:n], dataset.y_test[:n])


def linear_steps_to_target(
    job: Any, dataset: Dataset, target: float, *, max_steps: int = 20_000
) -> int | None:
    """Mini-batch steps one machine needs to reach ``target`` test accuracy, or None."""
    for done, r in linear_evaluations(job, dataset, max_steps=max_steps):
        if r.accuracy >= target:
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
    if scenario.federation is not None:
        from simulations.federation import run_federation

        return run_federation(scenario, label=label, point=point, progress=progress)
    return Simulation(scenario, label=label, point=point, progress=progress).run()
