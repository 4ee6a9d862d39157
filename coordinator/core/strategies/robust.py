"""Robust aggregation: combine updates so that a minority of bad ones cannot steer.

Pure functions on a list of flat float32 updates (one per result), each returning
one float32 array; the strategies choose one by name (``strategy.aggregator``)
for sync rounds and FedBuff buffers. With ``n`` updates of which at most
``f = floor(byzantine_fraction · n)`` may be arbitrary:

- ``mean``: the (sample-weighted) mean; no protection, the best with none needed.
- ``median``: coordinate-wise median (Yin et al. 2018, Flower's FedMedian).
- ``trimmed_mean``: per coordinate, drop the ``f`` largest and ``f`` smallest
  values and average the rest (Yin et al. 2018, Flower's FedTrimmedAvg).
- ``krum``: Multi-Krum (Blanchard et al. 2017): score each update by the summed
  squared distance to its ``n − f − 2`` nearest others; average the ``n − f``
  best scored.
- ``centered_clip``: CenteredClip (Karimireddy, He & Jaggi 2021, as hivemind
  uses it): from the coordinate-wise median, iterate ``v += mean(clip(xᵢ − v,
  τ))`` a few times; τ is the median distance of the updates to ``v`` (scale-free,
  so no learning-rate-dependent constant to tune).

All are deterministic (ties and order fixed by the order of ``updates``) and
compute in float64. Weights are only used by ``mean``: a robust rule that
trusted a client's claimed sample count would let a liar weigh itself up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numba import njit

from coordinator.core.strategies.aggregate import weighted_mean

AGGREGATORS = ("mean", "median", "trimmed_mean", "krum", "centered_clip")


def byzantine_count(n: int, fraction: float) -> int:
    """How many of ``n`` updates a rule must survive: ``floor(fraction · n)``,
    capped so that an honest majority remains."""
    return max(0, min(int(np.floor(fraction * n + 1e-9)), (n - 1) // 2))


def small_median(x: np.ndarray) -> float:
    """``float(np.median(x))`` of a short 1-D float64 array, bit for bit: the middle
    value, or ``(a + b) / 2`` of the two middle ones as ``np.mean`` computes it,
    without np.median's ~20 µs of dispatch (a FedAsync window takes one per result;
    tests/coordinator/test_robust.py holds them equal). NaN goes to np.median."""
    v = sorted(x.tolist())
    n = len(v)
    if n == 0 or any(a != a for a in v):
        return float(np.median(x))
    h = n // 2
    return v[h] if n % 2 else (v[h - 1] + v[h]) / 2


def coordinate_median(updates: Sequence[np.ndarray]) -> np.ndarray:
    return np.median(np.stack(updates).astype(np.float64), axis=0).astype(np.float32)


def trimmed_mean(updates: Sequence[np.ndarray], f: int) -> np.ndarray:
    n = len(updates)
    if not 0 <= 2 * f < n:
        raise ValueError(f"trimmed_mean: cannot trim {f} from each end of {n} updates")
    s = np.sort(np.stack(updates).astype(np.float64), axis=0)
    return s[f : n - f].mean(axis=0).astype(np.float32)


def multi_krum(updates: Sequence[np.ndarray], f: int, m: int | None = None) -> np.ndarray:
    """Average of the ``m`` (default ``n − f``) updates with the best Krum scores."""
    n = len(updates)
    X = np.stack(updates).astype(np.float64)
    if n <= 2:
        return X.mean(axis=0).astype(np.float32)
    sq = (X * X).sum(axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (X @ X.T), 0.0)
    k = max(1, n - f - 2)
    scores = np.array([np.sort(np.delete(d2[i], i))[:k].sum() for i in range(n)])
    m = n - f if m is None else m
    best = np.argsort(scores, kind="stable")[: max(1, m)]
    return X[np.sort(best)].mean(axis=0).astype(np.float32)


def centered_clip(
    updates: Sequence[np.ndarray], *, iters: int = 3, tau: float | None = None
) -> np.ndarray:
    X = np.stack(updates).astype(np.float64)
    v = np.median(X, axis=0)
    for _ in range(iters):
        diff = X - v
        dist = np.sqrt((diff * diff).sum(axis=1))
        t = float(np.median(dist)) if tau is None else tau
        if t <= 0:
            break
        scale = np.minimum(1.0, t / np.maximum(dist, 1e-30))
        v = v + (diff * scale[:, None]).mean(axis=0)
    return v.astype(np.float32)


def aggregate(
    name: str,
    updates: Sequence[np.ndarray],
    weights: Sequence[float] | None = None,
    *,
    byzantine_fraction: float = 0.2,
) -> np.ndarray:
    """Combine ``updates`` by the rule ``name`` (see the module docstring)."""
    if not updates:
        raise ValueError("aggregate: no updates")
    f = byzantine_count(len(updates), byzantine_fraction)
    rules: dict[str, Callable[[], np.ndarray]] = {
        "mean": lambda: weighted_mean(updates, weights or [1.0] * len(updates)),
        "median": lambda: coordinate_median(updates),
        "trimmed_mean": lambda: trimmed_mean(updates, f),
        "krum": lambda: multi_krum(updates, f),
        "centered_clip": lambda: centered_clip(updates),
    }
    rule = rules.get(name)
    if rule is None:
        raise ValueError(f"aggregator: unknown {name!r}; expected one of {AGGREGATORS}")
    return rule()


class SlidingWindow:
    """FedAsync's last ``k`` deltas and their combination, one step per arrival.

    A single async update cannot be outvoted, so with ``window > 1`` each arrival
    steps by the aggregator's combination of the newest ``k`` deltas instead of
    by its own delta. With ``centered_clip`` the centre is carried from one
    arrival to the next (as in Karimireddy, He & Jaggi's CClip with momentum):
    the clipping starts from the previous centre rather than a coordinate
    median, and one iteration per arrival is enough (three gave the same attack
    figures in docs/simulations.md at 3-4x the cost): two passes over ``k ×
    size`` float32 values, 0.3 ms for 19 k parameters and ~57 ms for 2.1 M
    with k = 16, not the median's seconds. Other aggregators combine the
    window from scratch.
    """

    __slots__ = ("aggregator", "byzantine_fraction", "centre", "count", "iters", "rows")

    def __init__(
        self, k: int, size: int, aggregator: str, *, byzantine_fraction: float = 0.2
    ) -> None:
        if aggregator not in AGGREGATORS:
            raise ValueError(f"aggregator: unknown {aggregator!r}; expected one of {AGGREGATORS}")
        self.rows = np.zeros((k, size), np.float32)
        self.count = 0
        self.centre: np.ndarray | None = None
        self.aggregator = aggregator
        self.byzantine_fraction = byzantine_fraction
        self.iters = 1

    def push(self, delta: np.ndarray, use: int | None = None) -> np.ndarray:
        """Add ``delta`` (dropping the oldest) and return the step to take now: the
        combination of the newest ``use`` deltas (all kept, by default)."""
        k = self.rows.shape[0]
        self.rows[self.count % k] = delta
        self.count += 1
        n = min(self.count, k) if use is None else max(1, min(use, self.count, k))
        if n == 1:
            return delta.copy()
        if n == min(self.count, k):
            pick = np.arange(n)
        else:  # the newest n of the ring, newest first; read in place, never copied
            pick = np.array([(self.count - 1 - i) % k for i in range(n)], np.intp)
        if self.aggregator != "centered_clip":
            rows = [self.rows[i] for i in pick]
            return aggregate(self.aggregator, rows, byzantine_fraction=self.byzantine_fraction)
        v = (self.rows[pick[0]] if self.centre is None else self.centre).copy()
        dist = np.empty(n, np.float64)
        scale = np.empty(n, np.float32)
        acc = np.empty_like(v)
        for _ in range(self.iters):
            _distances(self.rows, pick, v, dist)
            tau = small_median(dist)
            if tau <= 0:
                break
            scale[:] = np.minimum(1.0, tau / np.maximum(dist, 1e-30))
            _clip_step(self.rows, pick, v, scale, acc)
        self.centre = v
        return v.copy()

    def state_dict(self) -> dict:
        return {
            "rows": self.rows.copy(),
            "count": self.count,
            "centre": None if self.centre is None else self.centre.copy(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.rows[...] = np.asarray(state["rows"], np.float32)
        self.count = int(state["count"])
        c = state["centre"]
        self.centre = None if c is None else np.array(c, dtype=np.float32)


@njit(cache=True, nogil=True)
def _distances(X: np.ndarray, pick: np.ndarray, v: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = ‖X[pick[i]] − v‖`` accumulated in float64, without a ``X − v`` copy."""
    for i in range(pick.shape[0]):
        r = pick[i]
        acc = 0.0
        for j in range(X.shape[1]):
            d = np.float64(X[r, j] - v[j])
            acc += d * d
        out[i] = np.sqrt(acc)


@njit(cache=True, nogil=True)
def _clip_step(
    X: np.ndarray, pick: np.ndarray, v: np.ndarray, scale: np.ndarray, acc: np.ndarray
) -> None:
    """``v += mean_i(scale[i] · (X[pick[i]] − v))``: the picked rows read in place."""
    n, m = pick.shape[0], X.shape[1]
    total = np.float32(0.0)
    for i in range(n):
        total += scale[i]
    for j in range(m):
        acc[j] = -total * v[j]
    for i in range(n):
        s = scale[i]
        r = pick[i]
        for j in range(m):
            acc[j] += s * X[r, j]
    inv = np.float32(1.0 / n)
    for j in range(m):
        v[j] += acc[j] * inv
