"""Sweep throughput: the same scenario grid run one point after another, and as
Ray tasks on a local Ray of 1 and of 2 CPUs, in one invocation.

The grid is the shipped ``smoke`` scenario made a little bigger (16 players on
digits in 8 shards, roblox links, to 0.95: about 1 s of work each) over
``--points`` seeds: points of similar size, as a latency or dropout sweep
has. Throughput is points per wall second from the first point handed out
to the last result back; the Ray figures include starting the local Ray (its
start is reported apart too) but not importing crowdgrad. Every Ray
result is compared with the sequential one, field by field and series by
series, so a speedup that changed a number would be caught.

    .venv/bin/python benchmarks/sweep.py [--points 200] [--cpus 1,2] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from simulations.distributed import run_point, run_points_on_ray  # noqa: E402
from simulations.scenario import expand_sweep, load_raw, resolve  # noqa: E402


def grid(points: int) -> list[tuple[str, dict, object]]:
    data = load_raw(resolve("smoke"))
    data["clients"]["count"] = 16
    data["job"]["data"]["shards"] = 8
    data["job"]["stop"]["target_accuracy"] = 0.95
    data["sweep"] = {"seed": list(range(1, points + 1))}
    return [(f"seed={p['seed']}", p, sc) for p, sc in expand_sweep(data, source="smoke")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=200)
    ap.add_argument("--cpus", default="1,2", help="local Ray sizes to run")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.points < 1:
        ap.error(f"--points: expected >= 1, got {args.points}")
    pts = grid(args.points)
    run_point(
        pts[0][2], pts[0][0], pts[0][1]
    )  # warm: numba kernels compiled and cached, data loaded
    t0 = time.perf_counter()
    seq = [run_point(sc, label, point) for label, point, sc in pts]
    seq_s = time.perf_counter() - t0
    rows = [{"runner": "sequential", "cpus": 1, "wall_s": seq_s, "points_per_s": len(pts) / seq_s}]
    for cpus in (int(c) for c in args.cpus.split(",")):
        import ray

        t0 = time.perf_counter()
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
        start_s = time.perf_counter() - t0
        try:
            out = run_points_on_ray(pts)
        finally:
            ray.shutdown()
        wall = time.perf_counter() - t0
        same = all(asdict(a) == asdict(b) for a, b in zip(seq, out, strict=True))
        rows.append(
            {
                "runner": "ray",
                "cpus": cpus,
                "wall_s": wall,
                "ray_start_s": start_s,
                "points_per_s": len(pts) / wall,
                "vs_sequential": seq_s / wall,
                "identical": same,
            }
        )
    report = {"benchmark": "sweep", "scenario": "smoke", "points": len(pts), "rows": rows}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{len(pts)} points of the smoke scenario")
    for r in rows:
        extra = (
            f"  x{r['vs_sequential']:.2f} sequential, Ray start {r['ray_start_s']:.1f} s, "
            f"identical={r['identical']}"
            if r["runner"] == "ray"
            else ""
        )
        print(f"{r['runner']:>10} {r['cpus']} CPU: {r['wall_s']:7.1f} s "
              f"{r['points_per_s']:6.2f} points/s{extra}")  # fmt: skip


if __name__ == "__main__":
    main()
