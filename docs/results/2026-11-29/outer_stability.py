"""Session 17: why a momentum outer step and a stale delta do not mix, on a
quadratic. Each round the crowd's mean delta in a direction of curvature
``lam`` is ``-lam * x`` as it was ``delay`` rounds ago (``lam`` 1: the local
task solves that direction; up to 2 where its lr makes it overshoot), taken
by the outer step (Nesterov ``lr``, ``mu``; sgd is mu 0). Prints, per delay,
the worst spectral radius over ``lam`` in (0, 1] (above 1: that direction
grows; just under 1, the slowest direction sets it) and the gain in a flat
direction (lam 0.002) over plain averaging (sgd at lr 1). Synchronous rounds
are delay 0; an asynchronous crowd whose deltas come from the model of a
task-time ago is about delay 1, with prefetch about 2.

    python docs/results/2026-11-29/outer_stability.py
"""

import sys

import numpy as np


def radius(lr: float, mu: float, lam: float, delay: int) -> float:
    """Spectral radius of x[r+1] = x[r] + step, Nesterov on -lam * x[r - delay]."""
    n = delay + 2  # x[r], ..., x[r - delay], velocity
    a = np.zeros((n, n))
    a[n - 1, n - 1] = mu
    a[n - 1, delay] -= lr * lam
    a[0, 0] = 1.0
    a[0, n - 1] += mu * mu
    a[0, delay] -= (mu + 1.0) * lr * lam
    for i in range(1, delay + 1):
        a[i, i - 1] = 1.0
    return float(max(abs(np.linalg.eigvals(a))))


def main() -> None:
    lams = np.linspace(0.001, 1.0, 300)
    sys.stdout.write("delay  outer            worst radius  flat gain\n")
    for delay in (0, 1, 2):
        for lr, mu in ((1.0, 0.0), (1.5, 0.0), (0.7, 0.9), (0.5, 0.9), (0.25, 0.9), (0.15, 0.95)):
            worst = max(radius(lr, mu, lam, delay) for lam in lams)
            flat = (1.0 - radius(lr, mu, 0.002, delay)) / 0.002
            name = f"sgd {lr}" if mu == 0 else f"nesterov {lr}/{mu}"
            sys.stdout.write(f"{delay:>5}  {name:<16} {worst:>12.3f}  {flat:>8.2f}\n")


if __name__ == "__main__":
    main()
