"""Session 20: can a sync round's transfers overlap the next round's compute?

Rounds to an accuracy when every replica of a DiLoCo round (K replicas of the
generated job, ``H`` SGD steps at lr 0.2, batch 16, each on its own iid shard;
outer Nesterov 0.9, its lr "auto" as the coordinator chooses it, or ``OLR``)
starts from

- ``sync``: the model the last round made (what decentral-sync does);
- ``delay``: the model one round older, plus ``LOOK`` times that round's step
  (a pipelined round: it starts while the last one is still in flight, from
  what the server had, extrapolated);
- ``eager``: the model one round older plus the replica's own last delta
  (Streaming DiLoCo's overlap: the client continues from its own end).

Communication is free here: the question is how many more rounds the staleness
costs, against rounds 1.5x shorter (3.6 s of compute instead of 5.4 s with the
link). One JSON line on stdout. ``--stability`` prints instead the largest outer
lr at which a one-round-stale Nesterov step (momentum 0.9) is stable on a
quadratic, per ``LOOK``, and its gain in a flat direction, against a sync round's.

    python docs/results/2026-11-29/overlap_rounds.py sync 64 104 150
    OLR=0.38 LOOK=0.5 python docs/results/2026-11-29/overlap_rounds.py delay 64 104 150
    python docs/results/2026-11-29/overlap_rounds.py --stability
"""

import json
import os
import sys

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, ".")

import numpy as np

THRESHOLDS = (0.75, 0.78, 0.80, 0.85)


def radius(lr: float, mu: float, lam: float, look: float, stale: bool) -> float:
    """Spectral radius of Nesterov on curvature ``lam`` whose delta is taken at the
    model one round old plus ``look`` times that round's step (stale) or at the
    current model."""
    # state: x[r], x[r-1], x[r-2], velocity; the gradient lam * (point it was taken at)
    g = np.zeros(4)
    if stale:
        g[1], g[2] = lam * (1 + look), -lam * look
    else:
        g[0] = lam
    a = np.zeros((4, 4))
    a[3] = mu * np.eye(4)[3] + g
    a[0] = np.eye(4)[0] - lr * (g + mu * a[3])
    a[1, 0] = a[2, 1] = 1.0
    return float(max(abs(np.linalg.eigvals(a))))


def stability() -> None:
    lams, mu = np.linspace(0.001, 1.0, 300), 0.9
    sync = 1.27  # the coordinator's peak: 0.95 of the edge
    flat = (1 - radius(sync, mu, 0.002, 0.0, False)) / 0.002
    worst = max(radius(sync, mu, lam, 0.0, False) for lam in lams)
    sys.stdout.write(f"sync: lr {sync}, worst radius {worst:.3f}, flat gain {flat:.2f}\n")
    for look in (0.0, 0.5, 1.0, 1.5, 2.0):
        stable = [
            lr
            for lr in np.arange(0.05, 1.5, 0.01)
            if max(radius(lr, mu, lam, look, True) for lam in lams) < 1.0
        ]
        best = max(stable)
        flat = (1 - radius(best, mu, 0.002, look, True)) / 0.002
        sys.stdout.write(f"one round stale, LOOK {look}: largest stable lr {best:.2f}, ")
        sys.stdout.write(f"flat gain {flat:.2f}\n")


def rounds(mode: str, k: int, h: int, max_rounds: int) -> dict:
    from coordinator.core.strategies.aggregate import OuterLrScale, OuterOptimizer
    from nn.data import classification_task, shard
    from nn.optim import Optimizer, OptState
    from nn.spec import ModelSpec
    from nn.train import evaluate, train_steps

    look = float(os.environ.get("LOOK", "0"))
    olr = os.environ.get("OLR")
    ds = classification_task(200_000, seed=0)
    spec = ModelSpec(widths=(64, 256, 256, 10))
    model = spec.init_params(0)
    state = OptState.init(Optimizer.from_dict({"kind": "sgd", "lr": 0.2}), spec)
    parts = shard(ds.y_train, k, kind="iid", seed=0)
    data = [(ds.X_train[p], ds.y_train[p]) for p in parts]
    rngs = [np.random.default_rng(1 + i) for i in range(k)]
    outer = OuterOptimizer(kind="nesterov", lr=1.0, momentum=0.9)
    auto = OuterLrScale(kind="nesterov", momentum=0.9)
    coverage = min(1.0, h * 16 / len(parts[0]))  # one task a shard a round
    replica = model.copy()
    older = older2 = model.data.copy()  # the models one and two rounds old
    own = [np.zeros_like(model.data) for _ in range(k)]
    hit: dict[str, int] = {}
    r, acc = 0, 0.0
    for r in range(1, max_rounds + 1):
        deltas = []
        for i, ((X, y), rng) in enumerate(zip(data, rngs, strict=True)):
            if mode == "sync":
                start = model.data
            elif mode == "delay":
                start = older + np.float32(look) * (older - older2)
            else:
                start = older + own[i]
            replica.data[:] = start
            train_steps(replica, state, X, y, h, 16, rng)
            own[i] = replica.data - start
            deltas.append(own[i])
        mean = np.mean(deltas, axis=0).astype(np.float32)
        lr = auto.observe(deltas, [1.0] * k, mean, coverage)
        lr = float(olr) if olr else lr
        older2, older = older, model.data.copy()
        outer.step(model.data, mean, lr)
        ev = evaluate(model, ds.X_test[:5000], ds.y_test[:5000])
        acc = ev.accuracy
        hit.update({str(t): r for t in THRESHOLDS if str(t) not in hit and acc >= t})
        if str(THRESHOLDS[-1]) in hit or not ev.loss < 1e6:
            break
    return {
        "mode": mode, "k": k, "h": h, "look": look, "outer_lr": olr or "auto",
        "rounds_to": hit, "rounds": r, "accuracy": acc,
    }  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:] == ["--stability"]:
        stability()
    else:
        mode, k, h, max_rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
        sys.stdout.write(json.dumps(rounds(mode, k, h, max_rounds)) + "\n")
