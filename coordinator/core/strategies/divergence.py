"""Divergence back-off: the tasks' lr comes down when most tasks at it diverged.

A client whose local training produced a non-finite update says so: it declines
the task with the reason word ``diverged`` (docs/protocol.md §3.13), or, an older
client, uploads it and has it refused ``nonfinite``. Either is a report against
the lr its task ran at (``task.lr_scale``, the multiplier on the job's lr). When,
among the tasks issued since the last cut, at least ``REPORTS_MIN`` diverged and
they outnumber the accepted ones, every later task's multiplier is capped at
``CUT`` times the highest one reported: the job's lr (or the crowd's scaling of
it) is too high for the model, as it would be on one machine, and the crowd
finds a lower one instead of declining every task for ever.

Robust by counting: clients that claim divergence falsely cannot cut the lr
while honest results come back at it, and the cap never goes under ``FLOOR``.
Tasks issued before a cut count neither way (the cut answered them). The cap
only falls; the plateau schedule (strategies/base.py) works under it.
"""

from __future__ import annotations

import logging
import math
from typing import Any

log = logging.getLogger(__name__)

#: the cap after a cut, as a share of the highest multiplier reported diverged
CUT = 0.5
#: diverged tasks (since the last cut) before the first cut: one is not a pattern
REPORTS_MIN = 2
#: the lowest cap, 2**-10 of the job's lr: ten cuts
FLOOR = 2.0**-10


class DivergenceGuard:
    """The cap on local tasks' lr multiplier, from diverged and accepted tasks."""

    __slots__ = ("_accepted", "_from_task", "_highest", "_reports", "cap", "cuts")

    def __init__(self) -> None:
        #: the most a task's lr multiplier may be (inf: no divergence seen)
        self.cap = math.inf
        #: cuts so far
        self.cuts = 0
        #: tasks with an id below this were issued before the last cut
        self._from_task = 0
        self._reports = 0
        self._accepted = 0
        self._highest = 0.0

    def accepted(self, task_id: int) -> None:
        """A result of task ``task_id`` was accepted: its lr worked."""
        if task_id >= self._from_task:
            self._accepted += 1

    def diverged(self, task_id: int, lr_scale: float, next_task_id: int) -> bool:
        """Task ``task_id``, run at ``lr_scale``, diverged (the holder said so);
        ``next_task_id``: the id the next task will get. Whether the cap fell."""
        if task_id < self._from_task:
            return False
        self._reports += 1
        self._highest = max(self._highest, lr_scale)
        if self._reports < REPORTS_MIN or self._reports <= self._accepted:
            return False
        was = self.cap
        self.cap = max(FLOOR, min(self.cap, CUT * self._highest))
        self.cuts += 1
        log.warning(
            "%d of the last %d tasks diverged (lr x %.4g): later tasks' lr capped at x %.4g",
            self._reports,
            self._reports + self._accepted,
            self._highest,
            self.cap,
        )
        self._from_task = next_task_id
        self._reports = self._accepted = 0
        self._highest = 0.0
        return self.cap < was

    def state_dict(self) -> dict[str, Any]:
        return {
            "cap": None if math.isinf(self.cap) else self.cap,
            "cuts": self.cuts,
            "from_task": self._from_task,
            "reports": self._reports,
            "accepted": self._accepted,
            "highest": self._highest,
        }

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        state = state or {}  # (checkpoints before the guard: a fresh one)
        cap = state.get("cap")
        self.cap = math.inf if cap is None else float(cap)
        self.cuts = int(state.get("cuts", 0))
        self._from_task = int(state.get("from_task", 0))
        self._reports = int(state.get("reports", 0))
        self._accepted = int(state.get("accepted", 0))
        self._highest = float(state.get("highest", 0.0))
