"""700 roblox players on the generated workload, against one machine at the same rate.

Issue 33's last simulated target: 700 players on roblox links (50 kB/s each way,
30 messages/s) train crowd.py's generated job (classify:200,000, model [64, 256,
256, 10], batch 16) with the job's defaults, at least 10x sooner than one
machine at its best, with their share of the ideal-data-parallel speedup
(``--players`` for the issue's smaller crowds, 8 and 64). As the
seed's tables and ``simulations.py``'s large preset do, every player and the
machine compute at ``--flops`` (2.4e8 FLOP/s: the seed's Luau VM,
docs/simulations.md), so the machine's time is its steps times the FLOPs of a
step over that rate.

* **crowd**: the simulator with real numerics, ``--virtual-s`` virtual s, the
  job's defaults except ``data.shards`` (``--shards``: a first-time player
  fetches its shard over the link, and one pass over it caps a task) and an
  evaluation every ``--eval-every`` versions on 5,000 held-out rows. With
  ``--rounds`` its strategy is the tuned DiLoCo rounds instead (ROUNDS, a job
  setting: docs/performance.md, sessions 18-21), evaluated every round.
* **machine**: the same numerics, batch 16, SGD at each ``--lr`` (its best per
  threshold), evaluated every 250 steps.
* **ideal data parallelism**: one model taking a batch of N x 16 rows a step (N
  the players) at its best of ``--dp-lr``, each step timed as one batch-16 step:
  N players with free, instant communication averaging every step.

Reported per accuracy threshold: each one's virtual seconds, the crowd's speedup
(machine / crowd), ideal data parallelism's, and the crowd's share of it.

    python benchmarks/roblox_700.py [--players 700] [--virtual-s 600] [--json]
    python benchmarks/roblox_700.py --rounds --shards 128 --virtual-s 460 [--seed 2] --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from nn.data import Dataset, classification_task  # noqa: E402
from nn.spec import ModelSpec  # noqa: E402
from nn.threads import set_threads  # noqa: E402
from simulations.driver import Simulation  # noqa: E402
from simulations.scenario import parse_scenario  # noqa: E402

sys.path.append(str(_HERE))  # after the packages: only local_sgd is wanted from here
from local_sgd import run as local_sgd_run  # noqa: E402

PLAYERS = 700
ROWS = 200_000
WIDTHS = (64, 256, 256, 10)
BATCH = 16
#: accuracies timed; the low ones are where a 700-player crowd on these links is
#: within its first 900 virtual s (docs/performance.md, session 9)
THRESHOLDS = (0.5, 0.6, 0.7, 0.75, 0.78, 0.80, 0.85, 0.88, 0.90)
#: ``--rounds``: synchronous DiLoCo, outer Nesterov at the lr each round picks
ROUNDS = {
    "name": "decentral-sync",
    "outer_optimizer": "nesterov",
    "outer_lr": "auto",
    "lr": 0.2,
    "tau": 104,
}


def scenario(
    virtual_s: float,
    flops: float,
    shards: int,
    eval_every: int,
    players: int = PLAYERS,
    rounds: bool = False,
    seed: int = 1,
) -> dict[str, Any]:
    job: dict[str, Any] = {
        "model": {"widths": list(WIDTHS)},
        "data": {"dataset": f"classify:{ROWS}", "batch": BATCH, "shards": shards},
        "link": {"profile": "roblox"},
        "stop": {"max_time_s": virtual_s},
        "eval": {"every_versions": 1 if rounds else eval_every, "max_samples": 5000},
    }
    if rounds:
        job["strategy"] = dict(ROUNDS)
    return {
        "name": f"generated-{players}-roblox",
        "seed": seed,
        "job": job,
        "clients": {"count": players, "compute": flops, "latency": 0.05},
        "server": {"compute": flops},
        "run": {"mode": "numeric", "sample_every_s": 1.0},
    }


def crowd(raw: dict[str, Any]) -> dict[str, Any]:
    """The crowd of ``raw`` (a ``scenario``) run, and its accuracy curve."""
    sim = Simulation(parse_scenario(raw))
    t0 = time.perf_counter()
    r = sim.run()
    curve = [(x.t, x.accuracy) for x in r.series if x.accuracy is not None]
    s = r.summary
    return {
        "wall_s": round(time.perf_counter() - t0, 1),
        "virtual_s": s["virtual_seconds"],
        "reason": s["reason"],
        "results_accepted": s["results_accepted"],
        "bytes_up": s["bytes_up"],
        "bytes_down": s["bytes_down"],
        "best": max((a for _, a in curve), default=None),
        "final": curve[-1][1] if curve else None,
        "seconds_to": {str(t): next((x for x, a in curve if a >= t), None) for t in THRESHOLDS},
        "curve": [[round(x, 2), a] for x, a in curve],
    }


def one_model(
    ds: Dataset, lrs: list[float], k: int, max_steps: int, every: int, step_s: float
) -> dict[str, Any]:
    """Steps to each threshold at the best of ``lrs`` (benchmarks/local_sgd.py's
    ``run``): one machine (k = 1) or ideal data parallelism (one step on k x 16
    rows, timed as one batch-16 step)."""
    runs = [local_sgd_run(ds, k, 1, lr, max_steps, every, THRESHOLDS) for lr in lrs]
    best: dict[str, Any] = {}
    for t in map(str, THRESHOLDS):
        hits = [(r["steps_to"][t], r["lr"]) for r in runs if r["steps_to"][t]]
        if hits:
            steps, lr = min(hits)
            best[t] = {"steps": steps, "lr": lr, "seconds": steps * step_s}
        else:
            best[t] = None
    return {"runs": runs, "best": best}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--players", type=int, default=PLAYERS, help="the crowd's size")
    ap.add_argument("--virtual-s", type=float, default=600.0, help="the crowd's run")
    ap.add_argument(
        "--flops", type=float, default=2.4e8, help="FLOP/s of each player and the machine"
    )
    ap.add_argument("--shards", type=int, default=64, help="data.shards of the job")
    ap.add_argument("--eval-every", type=int, default=20, help="versions between evaluations")
    ap.add_argument("--lr", default="0.05,0.1,0.2", help="the machine's SGD lrs")
    ap.add_argument("--dp-lr", default="0.4,0.8,1.6", help="ideal data parallelism's lrs")
    ap.add_argument("--max-steps", type=int, default=150_000, help="the machine's")
    ap.add_argument("--dp-max-steps", type=int, default=2_000, help="ideal data parallelism's")
    ap.add_argument("--skip-crowd", action="store_true", help="the anchors only")
    ap.add_argument(
        "--rounds", action="store_true", help="the crowd in DiLoCo rounds (ROUNDS), not the default"
    )
    ap.add_argument("--seed", type=int, default=1, help="the crowd's scenario seed")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        lrs = [float(x) for x in args.lr.split(",")]
        dp_lrs = [float(x) for x in args.dp_lr.split(",")]
    except ValueError:
        ap.error(
            f"--lr / --dp-lr: expected comma-separated numbers, got {args.lr!r} / {args.dp_lr!r}"
        )
    if min(lrs + dp_lrs) <= 0:
        ap.error("--lr, --dp-lr: every lr must be positive")
    names = ("players", "virtual_s", "flops", "shards", "eval_every", "max_steps", "dp_max_steps")
    if args.seed < 0:
        ap.error("--seed: expected a number >= 0")
    for name in names:
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')}: expected a positive number")
    set_threads(1)
    spec = ModelSpec(widths=WIDTHS)
    step_s = spec.flops_per_sample(train=True) * BATCH / args.flops
    out: dict[str, Any] = {
        "players": args.players,
        "flops": args.flops,
        "step_s": step_s,
        "seed": args.seed,
    }
    ds = classification_task(ROWS, seed=0)
    out["machine"] = one_model(ds, lrs, 1, args.max_steps, 250, step_s)
    out["data_parallel"] = one_model(ds, dp_lrs, args.players, args.dp_max_steps, 25, step_s)
    if not args.skip_crowd:
        raw = scenario(
            args.virtual_s,
            args.flops,
            args.shards,
            args.eval_every,
            args.players,
            args.rounds,
            args.seed,
        )
        out["crowd"] = crowd(raw)
    out["strategy"] = dict(ROUNDS) if args.rounds else "the job's default"
    table = []
    for t in map(str, THRESHOLDS):
        m, dp = out["machine"]["best"][t], out["data_parallel"]["best"][t]
        c = out.get("crowd", {}).get("seconds_to", {}).get(t)
        speed = m["seconds"] / c if m and c else None
        dp_speed = m["seconds"] / dp["seconds"] if m and dp else None
        table.append({
            "accuracy": float(t),
            "machine_s": m and m["seconds"],
            "crowd_s": c,
            "data_parallel_s": dp and dp["seconds"],
            "speedup": speed,
            "data_parallel_speedup": dp_speed,
            "share_of_data_parallel": speed / dp_speed if speed and dp_speed else None,
        })  # fmt: skip
    out["table"] = table
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for row in table:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
