"""Prometheus metrics of a running coordinator (``GET /metrics``).

Theory of operation. ``Metrics`` is a sink of the core's outputs (it sees every
event and every frame the core sends, on the core thread) plus a few calls from
the network thread for what never reaches the core (frames in, heartbeat
echoes and their round-trip times, shards by HTTP). Counters are prometheus-client's, which are
thread-safe, except the per-frame ones (``FrameCounts``: plain integers, one table
per writing thread); each ``Metrics`` has its own ``CollectorRegistry``, so several
coordinators in one process (tests, a host app) never share a series. Gauges that
are a reading of state (model version, clients, queued bytes) are read at scrape
time from the service and the server, so they are never stale.

Names follow Prometheus conventions: prefix ``crowdgrad_``, counters end in
``_total``, durations are ``_seconds``, sizes ``_bytes``; labels are small closed
sets (outcome, reason words of docs/protocol.md §3.6, message types, kinds).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from coordinator.core import events as ev
from protocol import messages as m

#: Where a browser tab says who it is (client/web/src/session.js CLIENT_NAME): its
#: hello.platform starts with it, and so does hello.client when it sends no key.
BROWSER_CLIENT = "crowdgrad-web/"

#: Leases whose start the round-trip histogram remembers, at most: a backstop, as
#: every lease is forgotten when it ends; a client holds two at most (a prefetch).
MAX_LEASES_IN_FLIGHT = 100_000
#: A client's list of leased task ids is pruned to those in flight past this length.
_PRUNE_LEASED_TO = 8
_NOBODY = ("", 0.0)

#: Task round trip: lease to accepted result, from a tiny task on a LAN to a
#: large model on a 50 kB/s link.
ROUND_TRIP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
#: Heartbeat round trip: loopback to a congested mobile link.
RTT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
#: An RTT above this is not one (an echo of another server's clock, a lying
#: client): not observed.
MAX_RTT_S = 600.0


def client_kind(name: str, platform: str = "") -> str:
    """``browser`` for the volunteer page's worker, ``other`` for anything else. A tab
    with a volunteer key sends its display name as ``name``, so ``platform`` says it."""
    browser = name.startswith(BROWSER_CLIENT) or platform.startswith(BROWSER_CLIENT)
    return "browser" if browser else "other"


class _Readings(Collector):
    """Gauges read at scrape time from whoever holds the state."""

    def __init__(self, read: Callable[[], dict[str, Any]]) -> None:
        self.read = read

    def collect(self) -> Iterable[GaugeMetricFamily]:
        r = self.read()
        for name, doc, value in (
            ("crowdgrad_model_version", "Current model version.", r.get("version")),
            ("crowdgrad_send_queue_bytes", "Bytes queued for clients now.", r.get("queued")),
            ("crowdgrad_send_queue_max_bytes",
             "Largest send queue of its own frames (downloads aside) a connection reached.",
             r.get("max_queued")),
            ("crowdgrad_acks_held", "Acks waiting for a durable checkpoint.", r.get("acks_held")),
            ("crowdgrad_pending_results",
             "Accepted results not yet merged into the model (buffers, open rounds).",
             r.get("pending")),
            ("crowdgrad_step_scale",
             "The schedule's multiplier on the server's next step (strategy.schedule).",
             r.get("step_scale")),
            ("crowdgrad_outer_lr",
             "The outer lr of the last sync round (decentral-sync; 'auto' chooses it per round).",
             r.get("outer_lr")),
        ):  # fmt: skip
            if value is not None:
                yield GaugeMetricFamily(name, doc, value=float(value))


class FrameCounts(Collector):
    """``crowdgrad_messages_total`` and ``crowdgrad_message_bytes_total``: frames and
    their bytes by direction and message type, the series every frame moves.

    Plain integers per ``(direction, type)`` instead of prometheus-client children
    (``labels()`` builds and looks up a tuple under a lock, ``inc()`` takes another:
    about 6 % of the coordinator's CPU at 1,000 clients, five frames per task round
    trip). Each table is written by one thread only (``tables``: one per writer, the
    network thread and the core thread), so no increment is lost without a lock;
    a scrape sums them. Same exposition as a labelled ``Counter``, ``_created`` too.
    """

    def __init__(self, tables: int) -> None:
        #: per writer: (direction, type) -> [frames, bytes]
        self.tables: list[dict[tuple[str, str], list[int]]] = [{} for _ in range(tables)]
        #: when each series first counted (a ``Counter`` child's ``_created``)
        self._created: dict[tuple[str, str], float] = {}

    def add(self, table: int, direction: str, message_type: str, nbytes: int) -> None:
        """One frame, counted by the writer that owns ``table``."""
        key = (direction, message_type)
        cell = self.tables[table].get(key)
        if cell is None:
            self._created.setdefault(key, time.time())
            cell = self.tables[table][key] = [0, 0]
        cell[0] += 1
        cell[1] += nbytes

    def totals(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(direction, type) -> (frames, bytes), all writers together."""
        out: dict[tuple[str, str], tuple[int, int]] = {}
        for table in self.tables:
            for key, (n, b) in list(table.items()):
                n0, b0 = out.get(key, (0, 0))
                out[key] = (n0 + n, b0 + b)
        return out

    def collect(self) -> Iterable[CounterMetricFamily]:
        labels = ["direction", "type"]
        frames = CounterMetricFamily(
            "crowdgrad_messages", "Websocket frames by direction and message type.", labels=labels
        )
        sizes = CounterMetricFamily(
            "crowdgrad_message_bytes", "Websocket frame bytes by direction and type.", labels=labels
        )
        for key, (n, b) in sorted(self.totals().items()):
            created = self._created.get(key)
            frames.add_metric(list(key), n, created=created)
            sizes.add_metric(list(key), b, created=created)
        yield frames
        yield sizes


#: FrameCounts' tables: frames counted on the network thread, and on the core thread
NET, CORE = 0, 1


def decline_label(reason: str) -> str:
    """The ``reason`` label of a decline: its word (before any ``": "`` detail) if
    docs/protocol.md §3.13 lists it, ``none`` if empty, else ``other``: a client
    may send another word, and strangers must not grow the label set (each label
    value is a series kept for the process's life)."""
    word = m.decline_word(reason)
    if not word:
        return "none"
    return word if word in m.DECLINE_REASONS else "other"


class Metrics:
    """The coordinator's Prometheus series; see the module docstring."""

    def __init__(self, read: Callable[[], dict[str, Any]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.results = Counter(
            "crowdgrad_results_total", "Results by outcome and reason (docs/protocol.md §3.6).",
            ["outcome", "reason"], registry=r,
        )  # fmt: skip
        self.leased = Counter(
            "crowdgrad_tasks_leased_total", "Tasks leased, by how the model went down.",
            ["download", "queued"], registry=r,
        )  # fmt: skip
        self.expired = Counter(
            "crowdgrad_leases_expired_total", "Leases whose deadline passed.",
            ["reissued"], registry=r,
        )  # fmt: skip
        self.declined = Counter(
            "crowdgrad_tasks_declined_total", "Tasks clients declined, by their reason word.",
            ["reason"], registry=r,
        )  # fmt: skip
        self.clients = Gauge(
            "crowdgrad_clients", "Clients connected now, by kind.", ["kind"], registry=r
        )
        self.joins = Counter(
            "crowdgrad_client_joins_total", "Sessions welcomed, by kind and resumption.",
            ["kind", "resumed"], registry=r,
        )  # fmt: skip
        self.frames = FrameCounts(tables=2)
        r.register(self.frames)
        self.shard_bytes = Counter(
            "crowdgrad_shard_bytes_total", "Data shard bytes served, by transport.",
            ["transport"], registry=r,
        )  # fmt: skip
        self.round_trip = Histogram(
            "crowdgrad_task_round_trip_seconds",
            "Lease to accepted result of one task (download, compute, upload).",
            buckets=ROUND_TRIP_BUCKETS, registry=r,
        )  # fmt: skip
        self.evaluations = Counter(
            "crowdgrad_evaluations_total", "Evaluations of the model.", registry=r
        )
        self.accuracy = Gauge(
            "crowdgrad_last_evaluation_accuracy", "Accuracy at the last evaluation.", registry=r
        )
        self.loss = Gauge(
            "crowdgrad_last_evaluation_loss", "Loss at the last evaluation.", registry=r
        )
        self.heartbeat_rtt_seconds = Histogram(
            "crowdgrad_heartbeat_rtt_seconds",
            "Round-trip time to clients, from their heartbeats' echo (docs/protocol.md §3.7).",
            buckets=RTT_BUCKETS, registry=r,
        )  # fmt: skip
        self.checkpoint_seconds = Histogram(
            "crowdgrad_checkpoint_seconds", "Writing one checkpoint, snapshot to commit.",
            buckets=DURATION_BUCKETS, registry=r,
        )  # fmt: skip
        self.finished = Gauge("crowdgrad_job_finished", "1 once the job is over.", registry=r)
        for kind in ("browser", "other"):
            self.clients.labels(kind=kind).set(0)
        self._kinds: dict[str, str] = {}
        #: leases in flight, for the round trip: task id -> (client, lease time). One
        #: leaves with its result, expiry, decline or client (``_end_leases``), so it
        #: holds a few per connected client, not one per stranger ever leased a task
        self._leased_at: dict[int, tuple[str, float]] = {}
        #: client -> the task ids leased to it, pruned to those still in flight
        self._leased_to: dict[str, list[int]] = {}
        # the children the core's events move once or twice a round trip, looked up once
        self._accepted = self.results.labels("accepted", "")
        self._leased: dict[tuple[str, bool], Any] = {}
        if read is not None:
            r.register(_Readings(read))

    # -- the core's outputs (core thread) -------------------------------------------

    def __call__(self, outputs: list[ev.Output]) -> None:
        add = self.frames.add
        for o in outputs:
            match o:
                case ev.Send():
                    add(CORE, "out", o.message.TYPE, len(o.frame))
                case ev.ResultAccepted():
                    self._accepted.inc()
                    lease = self._leased_at.pop(o.task_id, None)
                    if lease is not None and o.now >= lease[1]:
                        self.round_trip.observe(o.now - lease[1])
                case ev.ResultRejected():
                    self.results.labels("rejected", o.reason).inc()
                    self._leased_at.pop(o.task_id, None)
                case ev.TaskLeased():
                    key = (o.download, o.queued)
                    child = self._leased.get(key)
                    if child is None:
                        child = self._leased[key] = self.leased.labels(
                            o.download, str(o.queued).lower()
                        )
                    child.inc()
                    self._lease(o.client_id, o.task_id, o.now)
                case ev.LeaseExpired():
                    self.expired.labels(str(o.reissued).lower()).inc()
                    self._end_leases(o.client_id, (o.task_id,))
                case ev.TaskDeclined():
                    self.declined.labels(decline_label(o.reason)).inc()
                    self._end_leases(o.client_id, (o.task_id,))
                case ev.ClientJoined():
                    kind = self._kinds[o.client_id] = client_kind(o.name, o.platform)
                    self.clients.labels(kind=kind).inc()
                    self.joins.labels(kind, str(o.resumed).lower()).inc()
                case ev.ClientLeft():
                    kind = self._kinds.pop(o.client_id, None)
                    if kind is not None:
                        self.clients.labels(kind=kind).dec()
                    self._end_leases(o.client_id, self._leased_to.pop(o.client_id, ()))
                case ev.DataServed():
                    self.shard_bytes.labels("websocket").inc(o.nbytes)
                case ev.Evaluated():
                    self.evaluations.inc()
                    self.accuracy.set(o.accuracy)
                    self.loss.set(o.loss)
                case ev.JobFinished():
                    self.finished.set(1)
                case _:
                    pass
        # A backstop only (leases end above): never more than MAX_LEASES_IN_FLIGHT.
        if len(self._leased_at) > MAX_LEASES_IN_FLIGHT:
            for task_id in sorted(self._leased_at)[: MAX_LEASES_IN_FLIGHT // 2]:
                del self._leased_at[task_id]

    def _lease(self, client_id: str, task_id: int, now: float) -> None:
        """A lease starts: remember when, and for whom (core thread)."""
        self._leased_at[task_id] = (client_id, now)
        mine = self._leased_to.setdefault(client_id, [])
        mine.append(task_id)
        if len(mine) > _PRUNE_LEASED_TO:  # keep those still in flight: a few
            at = self._leased_at
            mine[:] = [t for t in mine if at.get(t, _NOBODY)[0] == client_id]

    def _end_leases(self, client_id: str, task_ids: Iterable[int]) -> None:
        """These leases of ``client_id`` ended without a result: forget their start
        (a task leased again since to another client keeps that client's)."""
        at = self._leased_at
        for t in task_ids:
            if at.get(t, _NOBODY)[0] == client_id:
                del at[t]

    # -- what never reaches the core (network thread) --------------------------------

    def frame_in(self, message_type: str, nbytes: int) -> None:
        self.frames.add(NET, "in", message_type, nbytes)

    def frame_out(self, message_type: str, nbytes: int) -> None:
        self.frames.add(NET, "out", message_type, nbytes)

    def heartbeat_rtt(self, seconds: float) -> None:
        """A client's heartbeat echoed ours: ``seconds`` = now − echo − held. One
        outside [0, MAX_RTT_S] says nothing true about the link and is dropped."""
        if 0.0 <= seconds <= MAX_RTT_S:
            self.heartbeat_rtt_seconds.observe(seconds)

    def http_shard(self, nbytes: int) -> None:
        self.shard_bytes.labels("http").inc(nbytes)

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)
