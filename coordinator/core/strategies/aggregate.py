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


#: "auto" outer lr (OuterLrScale): Nesterov's peak is OUTER_LR_AUTO_MARGIN of its
#: stability edge, times the share of a round's mean that is signal,
#: never below OUTER_LR_AUTO_MIN_SHARE of the peak (so that no estimate can stall)
OUTER_LR_AUTO_MARGIN = 0.95
OUTER_LR_AUTO_MIN_SHARE = 0.05
#: until a round of two or more deltas shows their spread, the share is taken as
#: K / (K + OUTER_LR_AUTO_PRIOR_NOISE), K the round's deltas (8 roblox players
#: were best at outer lr 0.7, 64 and 700 at 1.3; session 17)
OUTER_LR_AUTO_PRIOR_NOISE = 7.0
#: the running means forget at this rate per round
OUTER_LR_AUTO_DECAY = 0.9


def nesterov_edge(momentum: float) -> float:
    """The largest stable Nesterov outer lr on deltas that solve their direction
    exactly (a round's step on a quadratic whose local task reaches its minimum):
    ``2 (1 + m) / (1 + 2 m)``, 1.36 at momentum 0.9 (docs/results/2026-11-29/
    outer_stability.py). Plain SGD (momentum 0) has edge 2."""
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}")
    return 2.0 * (1.0 + momentum) / (1.0 + 2.0 * momentum)


def effective_count(weights: Sequence[float]) -> float:
    """Kish's effective number of terms of a weighted mean, ``(Σw)² / Σw²``:
    K for K equal weights, less where a few weights dominate."""
    total = float(sum(weights))
    square = float(sum(w * w for w in weights))
    if not (total > 0 and square > 0):
        raise ValueError(f"effective_count: weights must be positive, got {list(weights)}")
    return total * total / square


class OuterLrScale:
    """The outer lr of a round, from how much of its mean is signal.

    The mean of K deltas is their common direction ``mu`` plus noise. The step
    that best spends such an estimate is the noise-free step times ``|mu|² /
    (|mu|² + E|noise|²)`` (McCandlish et al. 2018, "An Empirical Model of
    Large-Batch Training": the best lr at batch B is ``eps_max / (1 + B_noise /
    B)``).

    - The noise-free step: ``OUTER_LR_AUTO_MARGIN`` of Nesterov's stability edge
      (1.29 at momentum 0.9; the flat directions gain most from the largest
      stable step), or 1 for sgd (plain averaging).
    - The noise: each round's weighted spread of its deltas about their mean,
      ``sigma²`` per delta, over K, times ``1 - coverage``, ``coverage`` the
      expected share of the job's rows the round's tasks sampled: a round that
      sampled every row has no noise from which rows it saw (sampling without
      replacement). Without that factor 64 roblox players, whose rounds sample
      half the rows, read the spread between shards as noise and stalled at
      0.871; counting shards instead of rows called 8 lan clients' rounds
      noiseless, and they diverged.
    - ``|mu|²``: ``|mean|²`` less that noise. Both as running means over rounds.

    So a round of a few volunteers steps short, and as the model converges and
    its deltas turn to noise the step shrinks on its own, as an annealed lr
    would. (decentral-sync also multiplies it by the held-out plateau's decay.)
    """

    __slots__ = ("noise", "peak", "signal")

    def __init__(self, *, kind: str, momentum: float) -> None:
        if kind not in ("sgd", "nesterov"):
            raise ValueError(f"outer optimizer: unknown kind {kind!r}; expected sgd or nesterov")
        self.peak = OUTER_LR_AUTO_MARGIN * nesterov_edge(momentum) if kind == "nesterov" else 1.0
        #: running mean of the noise in a round's mean
        self.noise: float | None = None
        #: running mean of |mu|², the squared norm of the deltas' common part
        self.signal: float | None = None

    def observe(
        self,
        deltas: Sequence[np.ndarray],
        weights: Sequence[float],
        mean: np.ndarray,
        coverage: float = 0.0,
    ) -> float:
        """Take in a round's deltas, their weights, the mean the round steps by and
        the expected share of the job's rows they sampled; return the round's
        outer lr."""
        if len(deltas) != len(weights) or not deltas:
            raise ValueError(f"observe: {len(deltas)} deltas but {len(weights)} weights")
        if not 0.0 <= coverage <= 1.0:
            raise ValueError(f"observe: coverage must be in [0, 1], got {coverage}")
        k = effective_count(weights)
        mean64 = mean.astype(np.float64)
        m2 = float(mean64 @ mean64)
        if len(deltas) >= 2 and k > 1.0:
            total = float(sum(weights))
            # one float64 buffer for every delta's distance to the mean: at 700
            # players a round's spread is otherwise three model-sized arrays per delta
            diff = np.empty_like(mean64)
            spread = 0.0
            for d, w in zip(deltas, weights, strict=True):
                np.subtract(d, mean64, out=diff)
                spread += float(w) * float(np.sum(np.square(diff, out=diff)))
            # unbiased for the weighted mean: E[Σw|d-m|²/Σw] = sigma² (1 - 1/k)
            sigma2 = spread / total / (1.0 - 1.0 / k)
            self.noise = self._mix(self.noise, sigma2 / k * (1.0 - coverage))
        if self.noise is None:
            share = k / (k + OUTER_LR_AUTO_PRIOR_NOISE)
            self.signal = self._mix(self.signal, m2 * share)
        else:
            self.signal = self._mix(self.signal, m2 - self.noise)
            signal = max(self.signal, 0.0)
            share = signal / (signal + self.noise) if signal + self.noise > 0 else 1.0
        return self.peak * max(share, OUTER_LR_AUTO_MIN_SHARE)

    @staticmethod
    def _mix(old: float | None, new: float) -> float:
        return new if old is None else OUTER_LR_AUTO_DECAY * old + (1 - OUTER_LR_AUTO_DECAY) * new

    def state_dict(self) -> dict[str, Any]:
        return {"noise": self.noise, "signal": self.signal}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        state = state or {}
        noise, signal = state.get("noise"), state.get("signal")
        self.noise = None if noise is None else float(noise)
        self.signal = None if signal is None else float(signal)


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
