"""Federated coordinators against one: the issue 21 targets, in virtual time.

Runs the shipped ``federation-8x64`` scenario (512 players on roblox links,
digits, 8 edge coordinators of 64 syncing with a root; simulations/federation.py)
and the same scenario with ``federation.enabled = false`` (all 512 players on
one coordinator, same job, same seed, same players), for each ``--seeds`` seed.
For each pair: virtual seconds to 0.90 (at the root for the federation) and
their ratio (target: at most 1.3), the root's bytes in and out against every
byte the single coordinator moved (target: at least 50x less), per edge too.
Virtual time, so the figures do not depend on the machine's load; each pair
takes about 2-4 minutes of wall on a 2-core machine.

    python benchmarks/federation.py [--seeds 1,2,3] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from nn.threads import set_threads  # noqa: E402
from simulations.runner import run_scenario  # noqa: E402
from simulations.scenario import load_raw, parse_scenario, resolve  # noqa: E402

SCENARIO = "federation-8x64"
#: the issue's targets: time to 0.90 within this factor, root traffic this much lower
MAX_TIME_RATIO = 1.3
MIN_TRAFFIC_RATIO = 50.0


def run(seed: int, federated: bool) -> dict[str, Any]:
    data = load_raw(resolve(SCENARIO))
    data.pop("sweep", None)
    data["seed"] = seed
    data["federation"]["enabled"] = federated
    t0 = time.perf_counter()
    s = run_scenario(parse_scenario(data, source=SCENARIO)).summary
    out = {
        "wall_s": round(time.perf_counter() - t0, 1),
        "time_to_target": s["time_to_target"],
        "accuracy": s["accuracy"],
        "versions": s["versions"],
        "steps": s["steps"],
        "bytes": s["bytes_up"] + s["bytes_down"],
    }
    if federated:
        out |= {
            "root_bytes_in": s["root_bytes_in"],
            "root_bytes_out": s["root_bytes_out"],
            "root_bytes_per_edge": s["root_bytes_per_edge"],
            "syncs": s["syncs"],
            "syncs_accepted": s["syncs_accepted"],
        }
    return out


def pair(seed: int) -> dict[str, Any]:
    single, fed = run(seed, False), run(seed, True)
    t1, tf = single["time_to_target"], fed["time_to_target"]
    root = fed["root_bytes_in"] + fed["root_bytes_out"]
    return {
        "seed": seed,
        "single": single,
        "federated": fed,
        "time_ratio": tf / t1 if t1 and tf else None,
        "traffic_ratio": single["bytes"] / root if root else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1", metavar="S,S,...", help="scenario seeds (1)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--seeds: expected comma-separated integers, got {args.seeds!r}")
    if not seeds or any(s < 0 for s in seeds):
        ap.error(f"--seeds: expected integers >= 0, got {args.seeds!r}")
    logging.disable(logging.WARNING)  # a root's norm refusals would flood stderr
    set_threads(1)
    rows = [pair(seed) for seed in seeds]
    times = [r["time_ratio"] for r in rows if r["time_ratio"] is not None]
    traffic = [r["traffic_ratio"] for r in rows if r["traffic_ratio"] is not None]
    out = {
        "scenario": SCENARIO,
        "runs": rows,
        "time_ratio_mean": statistics.fmean(times) if times else None,
        "traffic_ratio_min": min(traffic) if traffic else None,
        "targets": {"time_ratio_max": MAX_TIME_RATIO, "traffic_ratio_min": MIN_TRAFFIC_RATIO},
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for r in rows:
        s, f = r["single"], r["federated"]
        print(
            f"seed {r['seed']}: to 0.90 one coordinator {_s(s['time_to_target'])}, "
            f"federated {_s(f['time_to_target'])} (x{_x(r['time_ratio'])}); "
            f"one coordinator moved {s['bytes'] / 1e6:.1f} MB, the root "
            f"{f['root_bytes_in'] / 1e6:.2f} MB in + {f['root_bytes_out'] / 1e6:.2f} MB out "
            f"({_x(r['traffic_ratio'])}x less; {f['root_bytes_per_edge'] / 1e6:.2f} MB per "
            f"edge, {f['syncs']} syncs); wall {s['wall_s']} + {f['wall_s']} s"
        )
    print(
        f"time ratio, mean: x{_x(out['time_ratio_mean'])} (target <= {MAX_TIME_RATIO}); "
        f"root traffic, least: {_x(out['traffic_ratio_min'])}x less "
        f"(target >= {MIN_TRAFFIC_RATIO:g})"
    )


def _s(x: float | None) -> str:
    return "never" if x is None else f"{x:.2f} s"


def _x(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


if __name__ == "__main__":
    main()
