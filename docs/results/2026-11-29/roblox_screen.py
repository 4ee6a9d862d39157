"""One screen of session 15: the crowd of benchmarks/roblox_700.py (the
generated job, roblox links, 64 shards, every player at 2.4e8 FLOP/s) at N
players with dotted overrides of the scenario, one JSON line on stdout: the
virtual seconds to each threshold, best and final accuracy, results, bytes.
VS (environment) sets the virtual seconds (900; the 700-player run used 600).
From the repository root, for example:

    python docs/results/2026-11-29/roblox_screen.py s15-pf64-tau100 64 \\
        job.lease.prefetch=true job.strategy.tau=100
    VS=600 python docs/results/2026-11-29/roblox_screen.py s15-final-700 700
"""

import json
import os
import sys
import time

# One compute thread: two screens side by side on two cores otherwise spin
# against each other's kernel threads (session 17: 63 minutes of wall for a
# 64-player run that takes 7 with one thread each). The figures are the same
# to the digit.
os.environ.update(
    {
        v: os.environ.get(v, "1")
        for v in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
    }
)

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
import roblox_700 as rb

from simulations.driver import Simulation
from simulations.scenario import _set_path, parse_scenario

tag, players = sys.argv[1], int(sys.argv[2])
sets = {k: json.loads(v) for k, v in (kv.split("=", 1) for kv in sys.argv[3:])}
raw = rb.scenario(float(os.environ.get("VS", "900")), 2.4e8, 64, 20, players)
for k, v in sets.items():
    _set_path(raw, k, v)
t0 = time.time()
r = Simulation(parse_scenario(raw)).run()
curve = [(x.t, x.accuracy) for x in r.series if x.accuracy is not None]
s = r.summary
out = {
    "tag": tag,
    "players": players,
    "shards": 64,
    "set": sets,
    "to": {str(t): next((x for x, a in curve if a >= t), None) for t in rb.THRESHOLDS},
    "best": max(a for _, a in curve),
    "final": curve[-1][1],
    "results": s["results_accepted"],
    "bytes": s["bytes_up"] + s["bytes_down"],
    "wall_s": round(time.time() - t0, 1),
    "curve": curve,
}
sys.stdout.write(json.dumps(out) + "\n")
