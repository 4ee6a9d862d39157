"""The ceiling of the crowd's algorithm: synchronous local SGD with free communication.

K replicas each take H steps of SGD (batch 16, the job's) on their own iid
shard from the same model, then the model becomes their mean; repeat. No
network, no coordinator, no staleness: what averaging every H steps can buy
before any of the costs a real crowd adds. H = 1 is ideal data parallelism
(one step on K x 16 rows). Reported per (K, H, lr): the steps each replica took
to reach each accuracy (held-out, the first 5,000 test rows, every ``--every``
steps), and the **step speedup** against K = 1 at its own best lr (steps of the
one machine / steps of a replica: above 1, K replicas reach it in fewer
sequential steps). A crowd of K clients that each step as fast as the machine
can at best match this speedup in wall time; docs/performance.md compares it
with measured crowds.

    .venv/bin/python benchmarks/local_sgd.py --rows 200000 --k 14 --h 1,10,50,400,1562 \\
        --lr 0.2,0.4 --base-lr 0.05,0.1 --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from nn.data import classification_task, shard  # noqa: E402
from nn.optim import Optimizer, OptState  # noqa: E402
from nn.spec import ModelSpec  # noqa: E402
from nn.threads import set_threads  # noqa: E402
from nn.train import evaluate, train_steps  # noqa: E402

WIDTHS = [64, 256, 256, 10]
BATCH = 16
#: accuracies timed by default (``--thresholds``)
THRESHOLDS = (0.80, 0.85, 0.88, 0.90)


def run(
    ds, k: int, h: int, lr: float, max_steps: int, every: int, thresholds: tuple[float, ...]
) -> dict:
    """Steps per replica to each threshold (None: not within ``max_steps``)."""
    seed = 0
    spec = ModelSpec(widths=tuple(WIDTHS))
    params = spec.init_params(seed)
    rngs = [np.random.default_rng(seed + 1 + i) for i in range(k)]
    state = OptState.init(Optimizer.from_dict({"kind": "sgd", "lr": lr}), spec)  # no memory
    if k > 1 and h > 1:  # the replicas' shards and one model to train them from
        parts = shard(ds.y_train, k, kind="iid", seed=seed)
        data = [(ds.X_train[p], ds.y_train[p]) for p in parts]
        replica, total = params.copy(), np.empty_like(params.data)
    X_test, y_test = ds.X_test[:5000], ds.y_test[:5000]
    hit: dict[float, int] = {}
    best, done, next_eval, t0 = 0.0, 0, every, time.perf_counter()
    while done < max_steps and len(hit) < len(thresholds):
        if k == 1 or h == 1:  # one model: K one-step deltas averaged are one step on
            step = every - done % every  # K batches' rows; up to the next evaluation
            train_steps(params, state, ds.X_train, ds.y_train, step, BATCH * k, rngs[0])
            done += step
        else:
            total.fill(0.0)
            for (X, y), rng in zip(data, rngs, strict=True):
                replica.data[:] = params.data
                train_steps(replica, state, X, y, h, BATCH, rng)
                total += replica.data
            params.data[:] = total / np.float32(k)
            done += h
        if done < next_eval:
            continue
        next_eval = done + every
        r = evaluate(params, X_test, y_test)
        if not r.loss < 1e6:  # diverged (NaN included)
            break
        best = max(best, r.accuracy)
        hit.update({t: done for t in thresholds if t not in hit and r.accuracy >= t})
    return {
        "k": k, "h": h, "lr": lr, "best": round(best, 4), "steps_run": done,
        "steps_to": {str(t): hit.get(t) for t in thresholds},
        "seconds": round(time.perf_counter() - t0, 1),
    }  # fmt: skip


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000, help="classify:<rows>, crowd.py's job")
    ap.add_argument("--k", type=int, default=14, help="replicas (the crowd's size)")
    ap.add_argument("--h", type=ints, default=[1, 10, 50, 400, 1562], help="local steps")
    ap.add_argument("--lr", type=floats, default=[0.2, 0.4], help="the replicas' lrs")
    ap.add_argument("--base-lr", type=floats, default=[0.05, 0.1], help="K = 1's lrs")
    ap.add_argument(
        "--max-steps", type=int, help="per replica (default: 3 x --base-max-steps / K, >= 20,000)"
    )
    ap.add_argument("--base-max-steps", type=int, default=120_000, help="for K = 1")
    ap.add_argument("--every", type=int, default=200, help="steps between evaluations")
    ap.add_argument("--thresholds", type=floats, default=list(THRESHOLDS), help="accuracies")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.max_steps is None:
        args.max_steps = max(20_000, 3 * args.base_max_steps // max(1, args.k))
    for name in ("k", "max_steps", "base_max_steps", "every"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: expected >= 1")
    if min(args.h) < 1 or min(args.lr + args.base_lr) <= 0:
        ap.error("--h: expected >= 1; --lr, --base-lr: expected > 0")
    if not all(0 < t <= 1 for t in args.thresholds):
        ap.error("--thresholds: expected accuracies in (0, 1]")
    ths = tuple(sorted(args.thresholds))
    set_threads(1)
    console = Console(stderr=True)
    ds = classification_task(args.rows, seed=0)
    base = []
    for lr in args.base_lr:
        console.print(f"K=1 lr {lr:g}")
        base.append(run(ds, 1, args.every, lr, args.base_max_steps, args.every, ths))
    rows = []
    for h in args.h:
        for lr in args.lr:
            console.print(f"K={args.k} H={h} lr {lr:g}")
            rows.append(run(ds, args.k, h, lr, args.max_steps, args.every, ths))
    # the one machine at its best lr, per threshold
    machine = {
        t: min((b["steps_to"][t] for b in base if b["steps_to"][t]), default=None)
        for t in map(str, ths)
    }
    for r in rows:
        r["step_speedup"] = {
            t: round(machine[t] / s, 2) if machine[t] and s else None
            for t, s in r["steps_to"].items()
        }
    doc = {"rows_train": args.rows, "widths": WIDTHS, "batch": BATCH, "machine": machine,
           "base": base, "replicas": rows}  # fmt: skip
    if args.json:
        print(json.dumps(doc, indent=1))
        return
    table = Table(title=f"local SGD, K={args.k}, classify:{args.rows}, steps per replica")
    for col in ("K", "H", "lr", "best", *(f"to {t}" for t in ths), f"speedup to {ths[0]}"):
        table.add_column(col)
    for r in base + rows:
        sp = r.get("step_speedup", {}).get(str(ths[0]))
        table.add_row(str(r["k"]), str(r["h"]), f"{r['lr']:g}", f"{r['best']:.4f}",
                      *(str(r["steps_to"][str(t)] or "—") for t in ths),
                      "—" if sp is None else f"{sp:.2f}x")  # fmt: skip
    Console().print(table)


if __name__ == "__main__":
    main()
