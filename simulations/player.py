"""A simulated player: the real client session, driven in virtual time.

A :class:`Player` does not speak the protocol itself: it drives the real
:class:`client.session.ClientSession` (one per player, kept across connections,
like a tab that reconnects) and carries out its actions. ``Send`` goes up the
player's link; a ``ComputeRequest`` starts ``client.compute.run_task`` (on the
world's ``numerics``) and hands the update to ``compute_done`` ``FLOPs / rate``
virtual seconds later; ``Finished`` retires the player. The session is ticked
at its own ``next_wakeup()`` and asked to ``prefetch`` at its own
``prefetch_delay()`` into each compute. A churn drop kills the link and keeps
the session's model, computation and result for the next connection.

A player sees its simulation through :class:`World` and counts into its
:class:`Stats`; it never imports the driver (the driver makes players).
"""

from __future__ import annotations

from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any, Protocol

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
from coordinator.core.linkcodecs import slow_codecs
from coordinator.core.machine import Coordinator
from nn.data import Dataset
from nn.params import Params
from protocol import messages as m
from protocol.chunking import chunk_params
from protocol.limits import LinkLimits
from simulations.attacks import Attacker
from simulations.churn import Lifecycle
from simulations.engine import Engine, Event, Priority
from simulations.network import Link, LinkSpec
from simulations.scenario import Scenario


def player_key(seed: int, index: int) -> str:
    """A simulated player's volunteer key (seeded, so a run is reproducible)."""
    return f"sim-{seed}-player-{index:06d}"


@dataclass(slots=True)
class Stats:
    """A run's counters: the driver's, and the players' for their links and lies."""

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


class World(Protocol):
    """What a player reads and calls of the simulation it lives in
    (simulations.driver.Simulation, which makes the players)."""

    engine: Engine
    scenario: Scenario
    job: Any
    core: Coordinator
    limits: LinkLimits
    link_spec: LinkSpec
    dataset: Dataset
    stats: Stats
    byzantine: frozenset[int]
    #: a task id's steps, kept by the player until its result is accepted
    steps_of: dict[str, int]
    done: bool

    @property
    def numerics(self) -> Executor: ...

    def at_server(
        self, p: Player, conn_id: str, msg: m.Message, nbytes: int, first: bool
    ) -> None: ...

    def disconnect(self, conn_id: str, reason: str) -> None: ...


class Player:
    """One simulated client: a real :class:`ClientSession` plus a link, a compute
    rate and a churn lifecycle (see the module docstring)."""

    #: its random stream is ``<STREAM>/<index>``, its connections ``<CONN><index>.<n>``
    #: (another kind of client on the same engine takes its own: simulations/federation.py)
    STREAM = "player"
    CONN = "p"

    def __init__(self, sim: World, index: int) -> None:
        self.sim = sim
        self.index = index
        self.rng = sim.engine.rng(f"{self.STREAM}/{index}")
        self.flops = max(1.0, sim.scenario.clients.sample_flops(self.rng))
        # every codec of the job, the delta and slow-link ones too: a client offers
        # what it decodes (the coordinator sends deltas only to a client that lists
        # their codec, the slow-link codec only to one that lists it)
        c = sim.job.codecs
        slow = slow_codecs(sim.job)
        job_codecs = (c.model, c.update, c.delta, *(slow.names() if slow else ()))
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
                volunteer=player_key(sim.scenario.seed, index)
                if sim.scenario.clients.volunteers
                else None,
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
