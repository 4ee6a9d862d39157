"""Byzantine players against the default configuration: final accuracy and time to
0.90 under each attack, beside the clean run in the same invocation.

The shipped scenario ``simulations/scenarios/attacks-digits-64.toml`` (64 players
on digits, roblox links, decentral-async FedAsync with the validator's reference
norms and clipping), run once clean and once per attack with ``--fraction`` of the
players Byzantine (simulations/attacks.py), all from the same seed. Virtual time,
so the figures do not depend on this machine. ``--aggregation fedbuff
--aggregator centered_clip`` (or another) measures a robust buffered setup.

    .venv/bin/python benchmarks/attacks.py [--fraction 0.2] [--players 64] [--json]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from nn.data import load_dataset  # noqa: E402
from simulations.attacks import ATTACKS  # noqa: E402
from simulations.driver import Simulation  # noqa: E402
from simulations.scenario import load_raw, parse_scenario, resolve  # noqa: E402


def run(raw: dict, kind: str | None, fraction: float, dataset) -> dict:
    data = copy.deepcopy(raw)
    data.pop("sweep", None)
    if kind is None:
        data["clients"].pop("attack", None)
    else:
        data["clients"]["attack"] = {"kind": kind, "fraction": fraction}
    t0 = time.perf_counter()
    s = Simulation(parse_scenario(data), dataset=dataset).run().summary
    return {
        "attack": kind or "clean",
        "fraction": fraction if kind else 0.0,
        "accuracy": s["accuracy"],
        "time_to_0.90": s["time_to_target"],
        "reason": s["reason"],
        "byzantine": s["byzantine"],
        "honest_closes": s["honest_closes"],
        "results_rejected": s["results_rejected"],
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fraction", type=float, default=0.2)
    ap.add_argument("--players", type=int, default=64)
    ap.add_argument("--attacks", default=",".join(ATTACKS))
    ap.add_argument("--aggregation", choices=("fedasync", "fedbuff"), default=None)
    ap.add_argument("--aggregator", default=None)
    ap.add_argument("--window", type=int, default=None, help="FedAsync's strategy.window")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    raw = load_raw(resolve("attacks-digits-64"))
    raw["clients"]["count"] = args.players
    # unset options keep the job's defaults (coordinator/core/config.py)
    for key in ("aggregation", "aggregator", "window"):
        if getattr(args, key) is not None:
            raw["job"]["strategy"][key] = getattr(args, key)
    ds = load_dataset("digits", seed=0)
    rows = [run(raw, None, 0.0, ds)]
    clean = rows[0]
    for kind in args.attacks.split(","):
        rows.append(run(raw, kind, args.fraction, ds))
    for r in rows:
        r["accuracy_vs_clean"] = r["accuracy"] - clean["accuracy"]
        t, c = r["time_to_0.90"], clean["time_to_0.90"]
        r["time_vs_clean"] = t / c if t is not None and c else None
    if args.json:
        print(json.dumps({"players": args.players, "rows": rows}, indent=2))
        return
    title = (
        f"{args.players} players on digits, {args.fraction:.0%} Byzantine, "
        f"{args.aggregation or 'default'}/{args.aggregator or 'default'}"
    )
    table = Table(title=title)
    for col in ("attack", "accuracy", "vs clean", "t to 0.90", "x clean", "honest closed"):
        table.add_column(col, justify="right")
    for r in rows:
        t = r["time_to_0.90"]
        x = r["time_vs_clean"]
        table.add_row(
            r["attack"],
            f"{r['accuracy']:.4f}",
            f"{r['accuracy_vs_clean']:+.4f}",
            "-" if t is None else f"{t:.1f} s",
            "-" if x is None else f"{x:.2f}",
            str(r["honest_closes"]),
        )
    Console().print(table)


if __name__ == "__main__":
    main()
