"""One screen of session 17 on lan: the shipped ``generated-crowd`` scenario
(the generated job at the rate of this VM's real clients) with dotted
overrides, one JSON line on stdout: virtual seconds to 0.85 / 0.90 / 0.925,
best and final accuracy, results. From the repository root, for example:

    python docs/results/2026-11-29/lan_screen.py s17-lan2 clients.count=2 \\
        job.stop.max_time_s=30 job.stop.patience=0
"""

import json
import os
import sys
import time

# as roblox_screen.py: one compute thread, so that screens run side by side
os.environ.update(
    {
        v: os.environ.get(v, "1")
        for v in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
    }
)

sys.path.insert(0, ".")

from simulations.driver import Simulation
from simulations.scenario import _set_path, load_raw, parse_scenario, resolve

THRESHOLDS = (0.85, 0.9, 0.925)


def overrides(argv: list[str]) -> dict:
    """The dotted ``key=json`` overrides of a command line."""
    return {k: json.loads(v) for k, v in (kv.split("=", 1) for kv in argv)}


def raw_of(sets: dict) -> dict:
    """The shipped ``generated-crowd`` scenario (no sweep) with ``sets`` applied."""
    raw = load_raw(resolve("generated-crowd"))
    raw.pop("sweep", None)
    for k, v in sets.items():
        _set_path(raw, k, v)
    return raw


def summary(tag: str, sets: dict, r, thresholds: tuple[float, ...]) -> dict:
    """A run's line: its seconds to each threshold, best and final accuracy, results."""
    curve = [(x.t, x.accuracy) for x in r.series if x.accuracy is not None]
    return {
        "tag": tag,
        "set": sets,
        "to": {str(t): next((x for x, a in curve if a >= t), None) for t in thresholds},
        "best": max(a for _, a in curve),
        "final": curve[-1][1],
        "results": r.summary["results_accepted"],
    }


if __name__ == "__main__":
    sets = overrides(sys.argv[2:])
    t0 = time.time()
    r = Simulation(parse_scenario(raw_of(sets))).run()
    out = summary(sys.argv[1], sets, r, THRESHOLDS)
    out["wall_s"] = round(time.time() - t0, 1)
    sys.stdout.write(json.dumps(out) + "\n")
