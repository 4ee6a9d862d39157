"""The edge's uplink to its root: a desktop client whose compute is its crowd.

See coordinator/core/upstream.py for the design (model taken, progress carried, what is
persisted). This is the IO half: it runs on the edge server's event loop beside
uvicorn, talks to the root over the ordinary protocol, and reaches its own core
only through ``CoreService.call`` (the core's thread).
"""

from __future__ import annotations

import logging
import math
import platform
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from client.compute import ComputeOutput
from client.desktop import DesktopClient
from client.session import ComputeRequest
from coordinator.core.upstream import EDGE_PLATFORM, UpstreamState, rebase, sync

if TYPE_CHECKING:
    from coordinator.core.machine import Coordinator
    from coordinator.runtime.service import CoreService

log = logging.getLogger(__name__)


def attach_upstream(core: Coordinator) -> UpstreamState:
    """Make ``core`` an edge (kept if its checkpoint already made it one)."""
    if core.upstream is None:
        core.upstream = UpstreamState()
    return core.upstream


class EdgeUplink(DesktopClient):
    """The edge's client of the root: each root task is "let my crowd train".

    ``every_versions``: edge versions between syncs; ``every_s``: or at most this
    long (whichever comes first; the crowd may be small or slow). The client's
    reconnect loop gives "keep training while the root is away": the edge's
    service runs on regardless, and the next sync carries what its crowd did.
    """

    def __init__(
        self,
        url: str,
        service: CoreService,
        *,
        every_versions: int = 50,
        every_s: float = 30.0,
        poll_s: float = 0.05,
        **kwargs: Any,
    ) -> None:
        if every_versions < 1:
            raise ValueError(f"--upstream-every-versions: expected >= 1, got {every_versions}")
        if not every_s > 0 or not math.isfinite(every_s):
            raise ValueError(f"--upstream-every-s: expected a positive number, got {every_s}")
        kwargs.setdefault("name", f"edge-{platform.node()[:40]}")
        kwargs.setdefault("prefetch", False)
        kwargs.setdefault("fetch_data", False)
        kwargs.setdefault("priority", "normal")
        kwargs.setdefault("flops", 1e9)
        kwargs.setdefault("cache", False)
        kwargs.setdefault("backoff_cap", 10.0)  # an edge should find its root soon after it is back
        super().__init__(url, platform_name=EDGE_PLATFORM, **kwargs)
        self.service = service
        self.every_versions = every_versions
        self.every_s = every_s
        self.poll_s = poll_s

    def _compute(self, req: ComputeRequest) -> ComputeOutput | None:
        """On the client's worker thread: take the model, wait for the crowd, measure."""
        task = req.task
        if task.kind != "train":
            raise ValueError(
                f"an edge trains with its crowd; the root sent a {task.kind!r} task "
                "(run the root with a decentral strategy)"
            )
        call = self.service.call
        session = self.session
        assert session is not None
        # The root may send this task before it acks the last sync (acks wait for
        # its checkpoint): wait for that answer, or the edge would not know
        # whether the root has the progress that sync carried, and could add it twice.
        inflight = call(lambda core: list(core.upstream.inflight)).result()
        deadline = time.monotonic() + max(self.every_s, 30.0)
        while any(t in session.unacked for t in inflight) and time.monotonic() < deadline:
            if self.session is not session or session.computing != req.request_id:
                return None
            time.sleep(self.poll_s)
        accepted = set(session.accepted)

        def take(core: Coordinator, now: float) -> tuple[tuple[int, int], list]:
            version, out = rebase(core, req.params, task.model_version, now, accepted)
            return (version, core.model_contributions), out

        v0, before = self.service.act(take).result()
        deadline = time.monotonic() + self.every_s
        while time.monotonic() < deadline:
            if self.session is not session or session.computing != req.request_id:
                return None  # superseded, abandoned or stopping
            if self.service.stats.version >= v0 + self.every_versions:
                break
            if self.service.done.is_set():
                break
            time.sleep(self.poll_s)

        def measure(core: Coordinator) -> tuple[np.ndarray, float, int]:
            last = core.evaluator.last
            loss = float(last.loss) if last is not None else float("nan")
            return sync(core, task.task_id), loss, core.model_contributions - before

        update, loss, merged = call(measure).result()
        steps = merged * max(1, self.service.job.strategy.nominal_tau)
        log.info(
            "sync to the root: %d edge versions, %d results merged, |Δ| %.3g",
            self.service.stats.version - v0,
            merged,
            float(np.linalg.norm(update)),
        )
        return ComputeOutput(
            update=update,
            loss=loss if math.isfinite(loss) else 0.0,
            samples=steps * self.service.job.data.batch,
            steps=steps,
        )
