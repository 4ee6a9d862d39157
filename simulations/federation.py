"""Federated coordinators in virtual time: edges with their crowds, and a root.

What it models (``[federation]`` in a scenario; the real thing is ``crowdgrad coordinator
--upstream``, docs/operations.md): the scenario's crowd split evenly over ``edges`` real
:class:`~coordinator.core.machine.Coordinator` s, each running ``[job]`` (without its stop: the
root decides when the job ends) for its share; player ``i`` joins edge ``i mod edges`` and
keeps the compute rate, link and churn it has in the single-coordinator run of the same
scenario. The root is one more real Coordinator, running ``federation.root`` and the job's
stop, evaluated at the root. All of them share one engine, so one virtual clock.

Each edge's uplink (:class:`Uplink`) is a client of the root, driven through the real
``ClientSession`` over an edge-root link (``federation.link``, ``federation.latency``), and its
"compute" is what ``coordinator.federation.edge.EdgeUplink._compute`` does (rebase, let the
crowd train, sync, upload the pseudo-gradient, an empty one too), event-driven where the real
uplink polls. How it is modelled, and the figures: docs/simulations.md ("Federation: edges and
a root").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from client.session import Capabilities, ClientSession, ComputeRequest
from coordinator.core import events as ev
from coordinator.core.assembly import build_core
from coordinator.core.config import StopSection
from coordinator.core.data import load_job_data
from coordinator.core.upstream import EDGE_PLATFORM, UpstreamState, rebase, sync
from nn.data import Dataset
from protocol import messages as m
from simulations.churn import ChurnModel
from simulations.distributions import Fixed
from simulations.driver import Simulation, tuned_runtime
from simulations.engine import Engine, Event, Priority, stream_seed
from simulations.network import Link
from simulations.player import Player
from simulations.report import RunResult, Sample, run_summary
from simulations.scenario import ClientsSection, FederationSection, Scenario

#: FLOP/s an uplink advertises (EdgeUplink's default): only the root's lease
#: estimate reads it, and ``lease.min_s`` covers a sync
EDGE_FLOPS = 1e9
#: longest wait for the root's ack of the last sync before rebasing anyway
#: (EdgeUplink: ``max(every_s, 30)``)
ACK_WAIT_S = 30.0
#: an uplink the root closed reconnects after this long (a real one retries with
#: a backoff that starts below a second)
REJOIN_S = 1.0


class Uplink(Player):
    """An edge's client of the root: each root task is "let my crowd train"."""

    STREAM = "uplink"
    CONN = "e"

    def __init__(self, root: Simulation, index: int, edge: Simulation, fed: FederationSection):
        super().__init__(root, index)
        self.edge = edge
        self.every_versions = fed.every_versions
        self.every_s = fed.every_s
        job = root.job
        self.client = ClientSession(
            f"edge-{index}",
            Capabilities(
                flops=EDGE_FLOPS,
                platform=EDGE_PLATFORM,
                limits=root.limits,
                codecs=tuple(sorted({job.codecs.model, job.codecs.update})),
                prefetch=False,
                data=False,  # it trains on its crowd, never on the root's shards
            ),
            seed=int(self.rng.integers(2**32)),
        )
        self.links: list[Link] = []
        self.syncs = 0
        # the task being worked on: waiting for "acks" or for the "crowd"
        self.req: ComputeRequest | None = None
        self.waiting: str | None = None
        self.started = 0.0
        self.v0 = 0
        self.before = 0
        self.timer: Event | None = None
        edge.observer = self._edge_outputs

    @property
    def bytes_up(self) -> int:
        return sum(link.up.bytes_sent for link in self.links)

    @property
    def bytes_down(self) -> int:
        return sum(link.down.bytes_sent for link in self.links)

    def connect(self) -> None:
        super().connect()
        if self.link is not None and (not self.links or self.links[-1] is not self.link):
            self.links.append(self.link)

    def on_message(self, conn_id: str, msg: m.Message) -> None:
        super().on_message(conn_id, msg)
        if self.waiting == "acks" and isinstance(msg, m.Ack) and not self._sync_unacked():
            self._rebase()

    def _sync_unacked(self) -> bool:
        up = self.edge.core.upstream
        assert up is not None
        return any(t in self.client.unacked for t in up.inflight)

    def _compute(self, req: ComputeRequest) -> None:
        self._cancel_compute()
        now = self.sim.engine.now
        if req.task.kind != "train":
            reason = f"compute: an edge trains with its crowd, not a {req.task.kind!r} task"
            self._do(self.client.compute_failed(req.request_id, reason, now))
            return
        self.req, self.started = req, now
        # The root may send this task before it acks the last sync (acks wait for
        # its checkpoint): wait for that answer, or the edge could not know whether
        # the root has the progress that sync carried.
        if self._sync_unacked():
            self.waiting = "acks"
            wait = max(self.every_s, ACK_WAIT_S)
            self.timer = self.sim.engine.schedule(wait, self._rebase, priority=Priority.COMPUTE)
            return
        self._rebase()

    def _rebase(self) -> None:
        self.sim.engine.cancel(self.timer)
        self.timer = None
        req = self.req
        if req is None or self.client.computing != req.request_id:
            self._cancel_compute()  # superseded, abandoned or finished
            return
        accepted = set(self.client.accepted)
        task = req.task
        self.waiting = None  # the rebase's own model update is no progress
        self.v0 = self.edge.act(
            lambda core, now: rebase(core, req.params, task.model_version, now, accepted)
        )
        self.before = self.edge.core.model_contributions
        self.waiting = "crowd"
        self.timer = self.sim.engine.schedule(self.every_s, self._sync, priority=Priority.COMPUTE)

    def _edge_outputs(self, edge: Simulation, outputs: list[ev.Output]) -> None:
        """The edge's observer: sync once it moved ``every_versions`` versions."""
        if self.waiting != "crowd" or self.timer is None:
            return
        now = self.sim.engine.now
        if self.timer.time > now and edge.core.version >= self.v0 + self.every_versions:
            self.sim.engine.cancel(self.timer)
            self.timer = self.sim.engine.schedule(0.0, self._sync, priority=Priority.COMPUTE)

    def _sync(self) -> None:
        self.timer = None
        req = self.req
        self.req, self.waiting = None, None
        if req is None or self.client.computing != req.request_id:
            return
        core = self.edge.core
        job = self.edge.job
        update = sync(core, req.task.task_id)
        last = core.evaluator.last
        loss = float(last.loss) if last is not None else math.nan
        steps = (core.model_contributions - self.before) * max(1, job.strategy.nominal_tau)
        self.sim.steps_of[req.task.task_id] = steps
        self.syncs += 1
        now = self.sim.engine.now
        self._do(
            self.client.compute_done(
                req.request_id,
                update,
                now,
                loss=loss if math.isfinite(loss) else 0.0,
                samples=steps * job.data.batch,
                steps=steps,
                compute_seconds=now - self.started,
            )
        )

    def _cancel_compute(self) -> None:
        super()._cancel_compute()
        self.sim.engine.cancel(self.timer)
        self.timer, self.req, self.waiting = None, None, None


def edge_seed(seed: int, edge: int) -> int:
    """Edge ``edge``'s coordinator seed: its own tasks' batches, as on its own server."""
    return int(stream_seed(seed, f"edge/{edge}").generate_state(1)[0])


class Federation:
    """One federated scenario point: ``run()`` returns its RunResult, the root's
    figures beside the crowd's (see the module docstring)."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        label: str = "",
        point: dict[str, Any] | None = None,
        progress: Callable[[float, float], None] | None = None,
        dataset: Dataset | None = None,
    ) -> None:
        fed = scenario.federation
        if fed is None:
            raise ValueError("federation: the scenario has no [federation]")
        self.scenario = scenario
        self.fed = fed
        self.label = label or scenario.name
        self.point = point or {}
        self.progress = progress
        self.engine = Engine(seed=scenario.seed)
        self.dataset = dataset or load_job_data(scenario.job)
        edge_job = scenario.job.model_copy(update={"stop": StopSection()})
        count = scenario.clients.count
        self.edges = []
        for e in range(fed.edges):
            core = build_core(edge_job, seed=edge_seed(scenario.seed, e), dataset=self.dataset)
            core.upstream = UpstreamState()
            self.edges.append(
                Simulation(
                    scenario,
                    label=f"edge {e}",
                    dataset=self.dataset,
                    engine=self.engine,
                    core=core,
                    players=range(e, count, fed.edges),
                )
            )
        uplinks = ClientsSection(
            count=fed.edges,
            compute=Fixed(value=EDGE_FLOPS),
            latency=fed.latency,
            churn=ChurnModel(rejoin=Fixed(value=REJOIN_S)),
            prefetch=False,
        )
        root_scenario = scenario.model_copy(
            update={"job": fed.root, "clients": uplinks, "federation": None}
        )
        root_core = build_core(fed.root, seed=scenario.seed, dataset=self.dataset)
        self.root = Simulation(
            root_scenario, label="root", dataset=self.dataset, engine=self.engine,
            core=root_core, players=[],
        )  # fmt: skip
        self.uplinks = [Uplink(self.root, e, edge, fed) for e, edge in enumerate(self.edges)]
        self.root.players = list(self.uplinks)
        self.series: list[Sample] = []

    @property
    def sims(self) -> list[Simulation]:
        return [*self.edges, self.root]

    def run(self) -> RunResult:
        for sim in self.sims:
            sim.start()
        self.engine.schedule_at(0.0, self._sample, priority=Priority.CONTROL)
        with tuned_runtime(overlap=False):
            try:
                self.engine.run_until(self.root.horizon, until=lambda: self.root.done)
            finally:
                for sim in self.sims:
                    sim.close()
        root = self.root.finish()
        edges = [edge.finish(f"root: {self.root.stop_reason}") for edge in self.edges]
        self._sample(reschedule=False)
        return RunResult(
            label=self.label,
            point=self.point,
            scenario=self.scenario.to_dict(),
            summary=self._summary(root.summary, [e.summary for e in edges]),
            series=self.series,
        )

    def _summary(self, root: dict[str, Any], edges: list[dict[str, Any]]) -> dict[str, Any]:
        """The usual fields for the whole system (bytes: every link, players' and
        edges'; steps: the crowd's; accuracy and time to target: the root's),
        then the root's traffic, the syncs, and each edge."""
        n = len(edges)
        up = root["bytes_up"] + sum(e["bytes_up"] for e in edges)
        down = root["bytes_down"] + sum(e["bytes_down"] for e in edges)
        summed = ("results_accepted", "results_rejected", "leases_expired", "tasks_prefetched")
        summed += ("drops", "frames_lost", "closes", "honest_closes")
        return (
            run_summary(
                mode="numeric",
                reason=root["reason"],
                virtual_seconds=root["virtual_seconds"],
                seconds=root["seconds"],
                steps=sum(e["steps"] for e in edges),
                versions=root["versions"],
                loss=root["loss"],
                accuracy=root["accuracy"],
                time_to_target=root["time_to_target"],
                linear_steps=root["linear_steps"],
                linear_seconds=root["linear_seconds"],
                bytes_up=up,
                bytes_down=down,
                players=self.scenario.clients.count,
            )
            | {k: sum(e[k] for e in edges) for k in summed}
            | {
                "events_run": self.engine.events_run,
                "edges": n,
                "root_bytes_in": root["bytes_up"],
                "root_bytes_out": root["bytes_down"],
                "root_bytes_per_edge": (root["bytes_up"] + root["bytes_down"]) / max(1, n),
                "root_steps": root["steps"],
                "syncs": sum(u.syncs for u in self.uplinks),
                "syncs_accepted": root["results_accepted"],
                "syncs_rejected": root["results_rejected"],
                "per_edge": [
                    {
                        "players": len(sim.players),
                        "versions": e["versions"],
                        "steps": e["steps"],
                        "accuracy": e["accuracy"],
                        "syncs": u.syncs,
                        "bytes_to_root": u.bytes_up,
                        "bytes_from_root": u.bytes_down,
                        "crowd_bytes_up": e["bytes_up"],
                        "crowd_bytes_down": e["bytes_down"],
                    }
                    for sim, u, e in zip(self.edges, self.uplinks, edges, strict=True)
                ],
            }
        )

    def _sample(self, reschedule: bool = True) -> None:
        sims, root = self.sims, self.root.stats
        self.series.append(
            Sample(
                t=self.engine.now,
                version=root.version,
                steps=sum(e.stats.steps for e in self.edges),
                loss=root.loss,
                accuracy=root.accuracy,
                bytes_up=sum(s.stats.bytes_up for s in sims),
                bytes_down=sum(s.stats.bytes_down for s in sims),
                clients_online=sum(len(e.core.conns) for e in self.edges),
            )
        )
        if self.progress is not None:
            self.progress(self.engine.now, self.root.horizon)
        if reschedule and not self.root.done:
            self.engine.schedule(
                self.scenario.run.sample_every_s, self._sample, priority=Priority.CONTROL
            )


def run_federation(
    scenario: Scenario,
    *,
    label: str = "",
    point: dict[str, Any] | None = None,
    progress: Callable[[float, float], None] | None = None,
    dataset: Dataset | None = None,
) -> RunResult:
    """Run one federated scenario point (``run_scenario`` comes here for them)."""
    return Federation(scenario, label=label, point=point, progress=progress, dataset=dataset).run()
