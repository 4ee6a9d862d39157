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

from coordinator.strategies.aggregate import weighted_mean

AGGREGATORS = ("mean", "median", "trimmed_mean", "krum", "centered_clip")


def byzantine_count(n: int, fraction: float) -> int:
    """How many of ``n`` updates a rule must survive: ``floor(fraction · n)``,
    capped so that an honest majority remains."""
    return max(0, min(int(np.floor(fraction * n + 1e-9)), (n - 1) // 2))


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
