"""The job's history: evaluations and throughput over time (``GET /api/history``).

Theory of operation. The service feeds ``History`` the core's outputs (on the
core thread) and samples its counters every ``every_s`` seconds. Both series
travel inside each checkpoint's metadata (JSON), so a coordinator restarted from
its store still shows the run from its beginning, and what a crash loses is
exactly what the checkpoint loses: the versions after it.

Bounded: each series keeps at most ``max_points``; when full, every other point
of the older half is dropped, so a week-long job keeps its whole shape at a
coarser grain (the newest points stay fine-grained).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from coordinator.core import events as ev

#: points per series before the older half is thinned
MAX_POINTS = 4096
EVALUATION_FIELDS = ("t", "version", "accuracy", "loss")
THROUGHPUT_FIELDS = (
    "t", "version", "accepted", "rejected", "clients", "results_per_s", "bytes_in", "bytes_out",
)  # fmt: skip


def _thin(points: list[list[float]], limit: int) -> None:
    if len(points) <= limit:
        return
    half = len(points) // 2
    points[:half] = points[:half:2]


class History:
    """Evaluation and throughput series; wall-clock seconds since the epoch."""

    def __init__(self, *, every_s: float = 5.0, max_points: int = MAX_POINTS) -> None:
        if not every_s > 0:
            raise ValueError(f"history every_s: must be > 0, got {every_s!r}")
        if max_points < 16:
            raise ValueError(f"history max_points: must be >= 16, got {max_points!r}")
        self.every_s = every_s
        self.max_points = max_points
        self.evaluations: list[list[float]] = []
        self.throughput: list[list[float]] = []
        self._last_sample = -math.inf
        self._last_counts: tuple[float, int] | None = None

    def observe(self, outputs: list[ev.Output], wall: float) -> None:
        """The core's outputs: evaluations go in as they happen."""
        for o in outputs:
            if isinstance(o, ev.Evaluated):
                self.evaluations.append([wall, o.version, o.accuracy, o.loss])
                _thin(self.evaluations, self.max_points)

    def due(self, wall: float) -> bool:
        return wall >= self._last_sample + self.every_s

    def sample(
        self,
        wall: float,
        *,
        version: int,
        accepted: int,
        rejected: int,
        clients: int,
        bytes_in: int,
        bytes_out: int,
    ) -> None:
        """One throughput point; results/s over the time since the last one."""
        rate = 0.0
        if self._last_counts is not None:
            t0, a0 = self._last_counts
            if wall > t0:
                rate = max(0.0, (accepted - a0) / (wall - t0))
        self._last_counts = (wall, accepted)
        self._last_sample = wall
        self.throughput.append(
            [wall, version, accepted, rejected, clients, round(rate, 3), bytes_in, bytes_out]
        )
        _thin(self.throughput, self.max_points)

    # -- as JSON: the API and the checkpoint metadata -----------------------------------

    def to_json(self, since: float | None = None) -> dict[str, Any]:
        """Columns and rows (compact, and what a chart library takes); ``since``: only
        points after that wall time."""

        def rows(points: list[list[float]]) -> list[list[float]]:
            return [p for p in points if since is None or p[0] > since]

        return {
            "evaluations": {"fields": list(EVALUATION_FIELDS), "rows": rows(self.evaluations)},
            "throughput": {"fields": list(THROUGHPUT_FIELDS), "rows": rows(self.throughput)},
        }

    def load(self, saved: Mapping[str, Any] | None) -> None:
        """Take the series a checkpoint carried (a missing or foreign one is ignored:
        history is for people, not for correctness)."""
        if not isinstance(saved, Mapping):
            return
        for name, fields, into in (
            ("evaluations", EVALUATION_FIELDS, self.evaluations),
            ("throughput", THROUGHPUT_FIELDS, self.throughput),
        ):
            part = saved.get(name)
            if not isinstance(part, Mapping) or list(part.get("fields", ())) != list(fields):
                continue
            good = [
                [float(x) for x in r]
                for r in part.get("rows", ())
                if isinstance(r, list) and len(r) == len(fields)
                and all(isinstance(x, int | float) and math.isfinite(x) for x in r)
            ]  # fmt: skip
            into[:0] = good[-self.max_points :]
