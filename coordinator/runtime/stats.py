"""What /api/status shows: counters of the core's events, kept by one more sink.

The core thread hands every batch of outputs to its sinks in order; ``Stats.count``
is one of them, so the counts are those of the frames and events that went out.
Written by the core thread only, read by anyone (each field is GIL-atomic).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from coordinator.core import events as ev

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Stats:
    """What /api/status shows; written by the core thread, read by anyone (GIL-atomic)."""

    version: int = 0
    clients: int = 0
    accepted: int = 0
    #: results refused (a resend of one taken already is counted in ``resent``)
    rejected: int = 0
    #: results sent again after a reconnect and taken already (duplicates)
    resent: int = 0
    leases_expired: int = 0
    #: tasks clients declined (``decline``: the lease ended before its deadline)
    declined: int = 0
    #: tasks leased behind a running one at a client's prefetch
    tasks_prefetched: int = 0
    #: shard fetches over the websocket, and the shard bytes they carried
    data_fetches: int = 0
    data_bytes: int = 0
    #: shard downloads by HTTP (GET /data/{sha256}) and their bytes
    data_http_fetches: int = 0
    data_http_bytes: int = 0
    joined: int = 0
    left: int = 0
    last_eval: dict[str, float] | None = None
    #: evaluations run, and the seconds they took (timed by the evaluator)
    evaluations: int = 0
    evaluation_seconds: float = 0.0
    finished: dict[str, Any] | None = None
    checkpoints: int = 0
    last_checkpoint: int | None = None
    #: seconds the last checkpoint took to write (snapshot handed over to commit)
    last_checkpoint_s: float | None = None
    #: bytes the last checkpoint wrote, and the version it was incremental on
    last_checkpoint_bytes: int | None = None
    last_checkpoint_base: int | None = None
    #: the journal of in-place merges, when the job has one: merges logged, merges
    #: replayed at start, and whether acks wait for a checkpoint (a gap)
    journal: dict[str, Any] | None = None
    restored_from: int | None = None
    paused: bool = False
    #: clients (connection ids) with a result held while paused, until it resumes
    held_results: set[str] = field(default_factory=set)
    #: acks waiting for a durable checkpoint now, and snapshots taken for them
    acks_held: int = 0
    durable_checkpoints: int = 0
    #: adaptive replication's counters (``Replicator.summary``), when the job has it on
    replication: dict[str, Any] | None = None
    #: an edge's standing against its root (coordinator/core/upstream.py), when it is one
    upstream: dict[str, Any] | None = None
    #: a layer-split job's blocks: steps of each, boundary shards waiting and leased
    split: dict[str, Any] | None = None
    started: float = field(default_factory=time.monotonic)
    #: (monotonic time, accepted count) samples for the results/s window
    window: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=64))

    def throughput(self) -> float:
        """Accepted results per second over the last few seconds."""
        if len(self.window) < 2:
            return 0.0
        (t0, a0), (t1, a1) = self.window[0], self.window[-1]
        return (a1 - a0) / (t1 - t0) if t1 > t0 else 0.0

    def evaluation_share(self) -> float:
        """The share of the time since start the core spent evaluating."""
        up = time.monotonic() - self.started
        return self.evaluation_seconds / up if up > 0 else 0.0

    def count(self, outputs: list[ev.Output]) -> None:
        """Count a batch of the core's outputs (a sink of the core thread)."""
        for o in outputs:
            match o:
                case ev.TaskDeclined():
                    self.declined += 1
                case ev.ResultAccepted():
                    self.accepted += 1
                case ev.ResultRejected(resent=True):
                    self.resent += 1
                case ev.ResultRejected():
                    self.rejected += 1
                case ev.LeaseExpired():
                    self.leases_expired += 1
                case ev.TaskLeased(queued=True):
                    self.tasks_prefetched += 1
                case ev.DataServed():
                    self.data_fetches += 1
                    self.data_bytes += o.nbytes
                case ev.ClientJoined():
                    self.joined += 1
                case ev.ClientLeft():
                    self.left += 1
                case ev.Evaluated():
                    self.last_eval = {"version": o.version, "accuracy": o.accuracy, "loss": o.loss}
                    self.evaluations += 1
                    self.evaluation_seconds += o.seconds or 0.0
                    log.info("v%d: accuracy %.4f loss %.4f", o.version, o.accuracy, o.loss)
                case ev.JobFinished():
                    self.finished = {
                        "version": o.version,
                        "reason": o.reason,
                        "accuracy": o.accuracy,
                        "best_of": o.best_of,
                    }
                    log.info("job finished: %s at v%d", o.reason, o.version)
                case _:
                    pass
