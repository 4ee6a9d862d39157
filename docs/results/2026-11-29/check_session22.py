"""Check docs/performance.md's session 22 figures against the files they came from:
the lent machine's two real runs (each row's seconds to each threshold from its
curve, the ratios, best, results/s and how it ended), the simulator's screens
beside them, and that the roblox crowds run identically under the new cap.
Prints the mismatches (none expected). From the repository root:

    python docs/results/2026-11-29/check_session22.py
"""

import json
import sys

from published import HERE, load_runs

sys.path.insert(0, str(HERE.parents[2]))
from crowdgrad.anchor import time_to

THRESHOLDS = (0.85, 0.9, 0.94, 0.9594, 0.9662)
#: run name prefix: (seconds to THRESHOLDS, best, ended at), as the tables print them
REAL = {
    "one machine": ([8.8, 16.1, 35.1, 42.6, 53.3], 0.968, None),
    "14 client": ([4.55, 6.57, 14.9, 25.7, None], 0.964, 54.0),
    "2 client": ([5.96, 9.40, 19.4, 29.3, 38.0], 0.969, 59.1),
    "1 client": ([7.86, 11.9, 21.3, 34.5, 39.2], 0.971, None),
}
#: the run without --grid: the crowds' seconds to the first four and to 0.9662
SECOND = {
    "14 client": ([3.74, 5.25, 11.5, 24.1, 56.6], 0.968, None),
    "2 client": ([5.03, 8.06, 16.9, 23.2, 31.8], 0.970, 44.1),
}
#: the ratios the table prints (machine over crowd), first run
RATIOS = {
    "14 client": [1.93, 2.44, 2.35, 1.66, None],
    "2 client": [1.48, 1.71, 1.81, 1.45, 1.40],
    "1 client": [1.12, 1.35, 1.65, 1.23, 1.36],
}
#: simulated: tag: (seconds to 0.85, 0.9, 0.94, 0.95, 0.9594, 0.9662; best; ended; end)
SIM = {
    "s22-sim1": ([8.75, 13.25, 25.75, 33.75, 41.0, 49.25], 0.9716, "max_time"),
    "s22-sim2": ([5.25, 8.0, 18.25, 18.75, 29.5, None], 0.963, "converged"),
    "s22-sim14": ([4.0, 5.5, 12.75, 20.25, 31.0, None], 0.9652, "converged"),
    "s22-sim14-noscale": ([4.75, 7.25, 13.75, 16.25, 22.75, 32.5], 0.9712, "converged"),
    "s22-sim14-scale2": ([4.0, 5.75, 10.5, 13.5, 21.75, 33.0], 0.9744, "converged"),
    "s22-sim14-new": ([4.0, 5.75, 11.0, 14.25, 21.0, 30.5], 0.9718, "converged"),
    "s22-sim2-new": ([5.25, 8.0, 19.25, 23.75, 26.5, 38.75], 0.9706, "max_time"),
    "s22-sim14-old-seed2": ([3.5, 5.5, 12.75, 13.75, 22.25, None], 0.9644, "converged"),
    "s22-sim14-new-seed2": ([3.25, 5.25, 10.0, 12.75, 18.25, 25.75], 0.9708, "converged"),
    "s22-sim8-old": ([4.25, 6.5, 14.75, 22.0, 23.25, 43.5], 0.9672, "max_time"),
    "s22-sim8-new": ([4.5, 6.25, 12.25, 15.25, 22.0, 33.0], 0.9702, "converged"),
}
#: roblox: tag: seconds to 0.75
ROBLOX = {
    "s22-default-8": 384.0,
    "s22-scale2-8": 491.0,
    "s22-default-64": 195.0,
    "s22-scale2-64": 409.0,
    "s22-noscale-64": 689.0,
}
bad = 0


def mismatch(what: str, got: object, published: object) -> None:
    global bad
    bad += 1
    sys.stdout.write(f"MISMATCH {what}: {got}, published {published}\n")


def near(a: float | None, b: float | None, tol: float) -> bool:
    return (a is None) == (b is None) and (a is None or abs(a - b) <= tol)


def check_real(name: str, published: dict) -> dict[str, list]:
    """Each published row of the real run ``name`` against its curve; the row's
    seconds to THRESHOLDS, by run-name prefix."""
    rows = json.loads((HERE / name).read_text())["rows"]
    times = {}
    for prefix, (seconds, best, ended) in published.items():
        (run,) = [r for r in rows if r["run"].startswith(prefix)]
        got = [time_to([tuple(p) for p in run["curve"]], t) for t in THRESHOLDS]
        times[prefix] = got
        for t, g, s in zip(THRESHOLDS, got, seconds, strict=True):
            if not near(g, s, 0.051):  # printed to 0.1 s, or to 0.01 s under 10 s
                mismatch(f"{name} {prefix} to {t}", g, s)
        if not near(run["best"], best, 0.0006):
            mismatch(f"{name} {prefix} best", run["best"], best)
        at = (run.get("ended") or {}).get("at_s")
        if not near(at, ended, 0.05):
            mismatch(f"{name} {prefix} ended", at, ended)
    return times


first = check_real("crowd-generated-1m-16core-h200-session22.json", REAL)
second = check_real("crowd-generated-1m-16core-h200-nogrid-session22.json", SECOND)
for prefix, ratios in RATIOS.items():
    got = [
        None if c is None else round(m / c, 2)
        for m, c in zip(first["one machine"], first[prefix], strict=True)
    ]
    if got != ratios:
        mismatch(f"ratios {prefix}", got, ratios)

sims = load_runs("lan16-screens-session22.json")
for tag, (seconds, best, ended) in SIM.items():
    run = sims[tag]
    got = [run["to"][k] for k in ("0.85", "0.9", "0.94", "0.95", "0.9594", "0.9662")]
    if got != seconds or abs(run["best"] - best) > 1e-9 or run["ended"] != ended:
        mismatch(tag, (got, run["best"], run["ended"]), (seconds, best, ended))
pmin, default = sims["s22-sim14-pmin03"], sims["s22-sim14"]
same = ("to", "best", "results", "end_s")
if [pmin[k] for k in same] != [default[k] for k in same]:
    mismatch("plateau_min 1/32: the default's times, best, results and end", "differ", "same")
if next(t for (t, a), (_, b) in zip(pmin["curve"], default["curve"], strict=True) if a != b) < 47:
    mismatch("plateau_min 1/32: the curves part after the default's floor", "sooner", "47.75 s")

#: the simulator against the mean of the real runs: clients: (tag, % at THRESHOLDS)
CALIBRATION = {
    1: ("s22-sim1", [11, 11, 21, 19, 25]),
    2: ("s22-sim2", [-4, -8, 1, 12, None]),
    14: ("s22-sim14", [-4, -7, -3, 25, None]),
}
for n, (tag, percents) in CALIBRATION.items():
    real = [run[f"{n} client"] for run in (first, second) if f"{n} client" in run]
    got = []
    for i, t in enumerate(THRESHOLDS):
        times = [x[i] for x in real if x[i] is not None]
        simulated = sims[tag]["to"][str(t)]
        ok = times and simulated is not None
        got.append(round(100 * (simulated / (sum(times) / len(times)) - 1)) if ok else None)
    if got != percents:
        mismatch(f"calibration at {n} clients", got, percents)

runs = load_runs("roblox-screens-session22.json")
for tag, t75 in ROBLOX.items():
    if runs[tag]["to"]["0.75"] != t75:
        mismatch(tag, runs[tag]["to"]["0.75"], t75)
for n in (8, 64):
    a, b = runs[f"s22-default-{n}"], runs[f"s22-new-{n}"]
    if (a["curve"], a["results"], a["bytes"]) != (b["curve"], b["results"], b["bytes"]):
        mismatch(f"{n} roblox players under the cap", "differ", "identical")
sys.stdout.write(f"session 22: {bad} mismatched\n")
sys.exit(1 if bad else 0)
