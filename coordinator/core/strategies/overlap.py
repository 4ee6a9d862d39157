"""Staleness by overlap: the steps since a task's lease that touched its neurons.

FedAsync weights a delta by ``f(s)``, ``s`` the versions since its task was
leased. With sub-model tasks most of those versions moved other neurons: an
IST slice of 640 of 4,096 neurons per layer sees ~100 versions go by in a
64-player crowd, ~16 of which touched a given neuron of it. ``s`` then says
100 where the slice is 16 merges old, and the hinge weighs the delta 0.034 where
0.15 is its own coordinates' staleness. The hinge's reasoning (N results
in flight, ~N·f(N) deltas per task time, ~1/a for any N) holds per coordinate
only if ``s`` counts the merges that coordinate saw.

``OverlapClock`` counts, per hidden neuron, the steps that touched it (a
sub-model merge its subnet's neurons, any other step all of them). A task's
overlap staleness is the mean over its neurons of the steps that touched them
since it was created: ``(Σ touched now − Σ touched then) / neurons``, so two
integers per task are kept. A version the clock did not see step (a merge
replayed from the journal on restart, an edge's rebase onto its root's model)
counts as touching every neuron. A model without hidden layers, or a task the
clock no longer holds (beyond ``MAX_TASKS``, or created before a restart from a
checkpoint without the clock), counts versions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from coordinator.core.leases import Task
from nn.spec import ModelSpec
from nn.subnet import Subnet, hidden_widths

#: tasks whose start the clock keeps (the oldest goes first; a task without one
#: counts versions): far more than a crowd holds at once
MAX_TASKS = 1 << 16


class OverlapClock:
    """Per hidden neuron, the steps that touched it; per open task, the sum at its start."""

    __slots__ = ("started", "steps", "touched", "widths")

    def __init__(self, spec: ModelSpec) -> None:
        self.widths = tuple(hidden_widths(spec))
        self.touched = [np.zeros(n, dtype=np.int64) for n in self.widths]
        #: the steps the clock has seen
        self.steps = 0
        #: task id -> (Σ touched over its neurons, steps) when it was created
        self.started: dict[int, tuple[int, int]] = {}

    def _sum(self, subnet: Subnet | None) -> tuple[int, int]:
        """Σ touched over the subnet's neurons (None: every neuron), and how many."""
        if subnet is None:
            return sum(int(t.sum()) for t in self.touched), sum(self.widths)
        total = sum(int(t[k].sum()) for t, k in zip(self.touched, subnet.keep, strict=True))
        return total, sum(int(k.size) for k in subnet.keep)

    def created(self, task: Task) -> None:
        if not self.widths:
            return
        self.started[task.task_id] = (self._sum(task.subnet)[0], self.steps)
        if len(self.started) > MAX_TASKS:
            del self.started[next(iter(self.started))]

    def staleness(self, task: Task, versions: int) -> int:
        """The task's overlap staleness (at most ``versions``, what it is without
        the clock)."""
        start = self.started.get(task.task_id)
        if start is None:
            return versions
        total, count = self._sum(task.subnet)
        unseen = max(0, versions - (self.steps - start[1]))
        return min(versions, round((total - start[0]) / count) + unseen)

    def forget(self, task: Task) -> None:
        self.started.pop(task.task_id, None)

    def step(self, subnets: Iterable[Subnet | None]) -> None:
        """One version: each neuron any of ``subnets`` holds (None: all) counts once."""
        if not self.widths:
            return
        self.steps += 1
        hit = [np.zeros(n, dtype=bool) for n in self.widths]
        for s in subnets:
            if s is None:
                for t in self.touched:
                    t += 1
                return
            for h, k in zip(hit, s.keep, strict=True):
                h[k] = True
        for t, h in zip(self.touched, hit, strict=True):
            t += h

    def step_one(self, subnet: Subnet | None) -> None:
        """One version that merged one result: its neurons only (no model-sized mask)."""
        if subnet is None or not self.widths:
            self.step([subnet])
            return
        self.steps += 1
        for t, k in zip(self.touched, subnet.keep, strict=True):
            t[k] += 1

    def state_dict(self) -> dict[str, Any]:
        flat = np.concatenate(self.touched) if self.touched else np.zeros(0, np.int64)
        return {
            "overlap_touched": flat.copy(),
            "overlap_steps": self.steps,
            "overlap_started": [[k, total, steps] for k, (total, steps) in self.started.items()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A checkpoint without the clock (or of another model) starts it afresh:
        its open tasks count versions."""
        flat = state.get("overlap_touched")
        if flat is None or np.asarray(flat).size != sum(self.widths):
            self.touched = [np.zeros(n, dtype=np.int64) for n in self.widths]
            self.steps, self.started = 0, {}
            return
        ends = np.cumsum(self.widths)[:-1]
        self.touched = [a.copy() for a in np.split(np.asarray(flat, dtype=np.int64), ends)]
        self.steps = int(state.get("overlap_steps", 0))
        self.started = {
            int(k): (int(total), int(steps)) for k, total, steps in state.get("overlap_started", [])
        }
