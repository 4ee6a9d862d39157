"""Update validation: nothing touches the model before passing these checks.

An update is a flat array meant to be added to (or subtracted from) the model.
It must be exactly the model's size, float32, all finite, and its L2 norm per local step
within ``norm_multiple`` × the running median of recently *accepted* non-zero norms and
the coordinator's own reference norms (coordinator/core/reference.py: without them
the check waits for ``norm_warmup`` accepted norms, and the first results are
trusted blindly). The median is over a window, so a few poisoned updates cannot
drag it upwards. An update that passes but is longer than ``clip_multiple`` ×
the median is scaled down to that length before it is applied: no single
result moves the model further than a few honest ones.
A failure is a reason code, data, never an exception: the core acknowledges
the result with it and counts it against the client.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections import deque

import numpy as np
from numba import njit

from coordinator.core.config import ValidationSection


class Reject(enum.Enum):
    """Reason codes sent in ``ack.reason`` for refused results."""

    SHAPE = "shape"
    DTYPE = "dtype"
    NONFINITE = "nonfinite"
    NORM = "norm"
    VERSION = "version"  # trained from another version than the task's
    STALE = "stale"
    DUPLICATE = "duplicate"
    UNKNOWN_TASK = "unknown_task"
    #: the task exists but was never leased to this client (or the session it resumed)
    NOT_LEASED = "not_leased"


class UpdateValidator:
    """Stateful only in the window of accepted norms (deterministic, checkpointed)."""

    __slots__ = ("config", "norms", "reference", "size")

    def __init__(self, config: ValidationSection, *, size: int) -> None:
        self.config = config
        self.size = size
        self.norms: deque[float] = deque(maxlen=config.norm_window)
        #: norms of the coordinator's own updates (trusted; reference.py)
        self.reference: list[float] = []

    def median(self) -> float | None:
        if not self.reference and len(self.norms) < self.config.norm_warmup:
            return None
        # statistics.median: a quarter of np.median's cost at these sizes
        return float(statistics.median([*self.reference, *self.norms]))

    def clip_scale(self, norm: float, *, effort: float = 1) -> float:
        """The factor (<= 1) that brings an accepted update to ``clip_multiple`` ×
        the median (per step); 1 when it is within that or clipping is off."""
        c = self.config.clip_multiple
        med = self.median()
        per_step = norm / effort
        if c is None or med is None or not per_step > c * med:
            return 1.0
        return c * med / per_step

    def check(
        self, update: np.ndarray, *, size: int | None = None, effort: float = 1
    ) -> tuple[Reject | None, float]:
        """``(reason or None, norm)``; call ``accept(norm, effort=...)`` once the result
        is taken. ``size``: the values expected when not the whole model's (a
        subnet's). ``effort``: the task's local steps times its lr multiplier;
        norms are compared per unit of it, since tasks under ``tau = "auto"``
        and ``lr_scaling`` differ in both (a delta grows at most linearly with
        each)."""
        if update.ndim != 1 or update.size != (self.size if size is None else size):
            return Reject.SHAPE, float("nan")
        if update.dtype != np.float32:
            return Reject.DTYPE, float("nan")
        # One pass for both checks: no float32 square overflows float64, so the
        # sum of squares is finite exactly when every value is.
        norm = math.sqrt(_sum_squares(update))
        if not math.isfinite(norm):
            return Reject.NONFINITE, float("nan")
        med = self.median()
        if med is not None and norm / effort > self.config.norm_multiple * max(med, 1e-12):
            return Reject.NORM, norm
        return None, norm

    def restart(self, reference: list[float]) -> None:
        """The model was replaced (an edge's rebase): forget the accepted norms and
        judge by ``reference``, the coordinator's own updates to the new model,
        until new ones come in (with none, the check waits for its warm-up)."""
        self.norms.clear()
        self.reference = list(reference)

    def accept(self, norm: float, *, effort: float = 1) -> None:
        """Count an accepted update's norm; a zero one is not counted. It says
        nothing about how long honest updates are (nothing was trained: an edge
        whose crowd had not returned a result yet, or a free rider), and enough
        of them made the median zero, after which every update failed the check
        (simulations/federation.py found it: a root refused every sync after
        its edges' first, empty, ones)."""
        if norm > 0:
            self.norms.append(norm / effort)


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _sum_squares(x):  # pragma: no cover - compiled
    """The sum of squares in float64, without a float64 copy of ``x`` (a copy and a
    dot took 6.7 ms for a 1 MB sub-model update on the extreme preset)."""
    acc = 0.0
    for v in x:
        w = np.float64(v)
        acc += w * w
    return acc
