"""Pure aggregation maths: staleness scales, schedules, weighted means, outer optimizers.

Everything here works on flat float32 arrays (``Params.data``) and holds no
state except the outer optimizer's momentum buffer, which is exported by
``state_dict`` for checkpoints. Kept apart from the strategies (as Flower keeps
``aggregate.py``) so the maths is tested without any scheduling around it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from nn.optim import momentum_step


def staleness_scale(staleness: int, *, kind: str, a: float = 0.5, b: int = 4) -> float:
    """How much an update computed ``staleness`` versions ago still counts.

    - ``constant``: 1, the update counts fully however old;
    - ``polynomial``: ``(1 + s) ** -a`` (FedAsync's polynomial function);
    - ``hinge``: 1 up to ``b`` versions, then ``1 / (a (s - b) + 1)``.
    """
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0, got {staleness}")
    match kind:
        case "constant":
            return 1.0
        case "polynomial":
            return float((1.0 + staleness) ** -a)
        case "hinge":
            return 1.0 if staleness <= b else 1.0 / (a * (staleness - b) + 1.0)
        case _:
            raise ValueError(f"staleness kind: unknown {kind!r}")


def schedule_factor(
    version: int,
    *,
    kind: str,
    start: float = 1.0,
    peak: float = 1.0,
    end: float = 1.0,
    warmup: int = 0,
    versions: int = 0,
) -> float:
    """The server's step multiplier at ``version`` (config.ScheduleSection).

    - ``constant``: 1;
    - ``warmup-cosine``: ``start`` to ``peak`` linearly over ``[0, warmup)``,
      ``peak`` to ``end`` along a half cosine over ``[warmup, versions)``, then
      ``end``.
    """
    if version < 0:
        raise ValueError(f"version must be >= 0, got {version}")
    match kind:
        case "constant":
            return 1.0
        case "warmup-cosine":
            if version < warmup:
                return start + (peak - start) * version / warmup
            if version >= versions:
                return end
            x = (version - warmup) / (versions - warmup)
            return end + (peak - end) * 0.5 * (1.0 + math.cos(math.pi * x))
        case _:
            raise ValueError(f"schedule kind: unknown {kind!r}")


def weighted_mean(arrays: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """Σ wᵢ xᵢ / Σ wᵢ in float64, returned as float32; the order of terms is fixed."""
    if not arrays:
        raise ValueError("weighted_mean: no arrays")
    if len(arrays) != len(weights):
        raise ValueError(f"weighted_mean: {len(arrays)} arrays but {len(weights)} weights")
    total = float(sum(weights))
    if not total > 0:
        raise ValueError(f"weighted_mean: weights must sum to > 0, got {total}")
    acc = np.zeros(arrays[0].shape, dtype=np.float64)
    for x, w in zip(arrays, weights, strict=True):
        acc += float(w) * x
    return (acc / total).astype(np.float32)


class OuterOptimizer:
    """Step on a pseudo-gradient: ``params += lr * direction`` (sgd) or Nesterov.

    ``direction`` is the way to move (an averaged delta, or a negated gradient).
    With sgd and lr 1 on averaged deltas this is plain model averaging; with
    Nesterov momentum (lr 0.7, momentum 0.9) it is DiLoCo's outer step.
    """

    __slots__ = ("kind", "lr", "momentum", "velocity")

    def __init__(self, *, kind: str = "sgd", lr: float = 1.0, momentum: float = 0.9) -> None:
        if kind not in ("sgd", "nesterov"):
            raise ValueError(f"outer optimizer: unknown kind {kind!r}; expected sgd or nesterov")
        self.kind = kind
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.velocity: np.ndarray | None = None

    def step(
        self,
        params: np.ndarray,
        direction: np.ndarray,
        scale: float = 1.0,
    ) -> None:
        """Update ``params`` (flat float32) in place, at ``scale`` times the lr
        (the job's schedule)."""
        lr = self.lr * scale
        if self.kind == "sgd":
            params += np.float32(lr) * direction.astype(np.float32, copy=False)
            return
        # Nesterov on the pseudo-gradient -direction: nn.optim's kernel keeps the
        # velocity of the gradient, the negation of the direction's velocity.
        if self.velocity is None:
            self.velocity = np.zeros_like(params, dtype=np.float32)
        grad = np.negative(direction, dtype=np.float32)
        momentum_step(params, grad, self.velocity, lr=lr, momentum=self.momentum, nesterov=True)

    def arrival(
        self, params: np.ndarray, direction: np.ndarray, share: float, scale: float = 1.0
    ) -> None:
        """One of about ``1 / share`` asynchronous arrivals that together make one
        round's step: each adds ``share`` of its direction to the velocity, which
        decays by ``momentum ** share``, and moves the params by ``share`` of the
        round's step. So K arrivals of the same direction move the params as one
        synchronous round of their mean would (Nesterov: within about 5 %, the
        velocity decaying between arrivals), not K times as far."""
        if self.kind == "sgd":
            self.step(params, direction, scale * share)
            return
        if self.velocity is None:
            self.velocity = np.zeros_like(params, dtype=np.float32)
        grad = np.negative(direction, dtype=np.float32)
        grad *= np.float32(share)
        beta = np.float32(self.momentum**share)
        self.velocity *= beta
        self.velocity += grad
        lr = np.float32(self.lr * scale)
        params -= lr * (grad + np.float32(share) * beta * self.velocity)

    def state_dict(self) -> dict[str, Any]:
        # Stored as the direction's velocity (what checkpoints have always held).
        return {"velocity": None if self.velocity is None else -self.velocity}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        v = state.get("velocity")
        self.velocity = None if v is None else -np.array(v, dtype=np.float32)
