"""One screen of session 22: the shipped ``generated-crowd`` scenario on the
1,000,000-row job (benchmarks/crowd.py's ``generated-1m``) with dotted
overrides, one JSON line on stdout: virtual seconds to each threshold, best
and final accuracy, results, how the run ended, its curve, and each time it
changed the crowd's lr multiplier (``Strategy.lr_scale()``: the concurrency's
scaling times the plateau cut, before a task's own ``max_scaled_steps`` cap). The real
16-core runs it is set beside are ``crowd-generated-1m-16core-h200-*.json``.
From the repository root, for example:

    python docs/results/2026-11-29/lan16_screen.py s22-sim14 clients.count=14 \\
        clients.join_over_s=1.3
"""

import json
import sys
import time

sys.path.insert(0, ".")

# first: lan_screen sets one compute thread before numba loads (screens run side by side)
from lan_screen import overrides, raw_of, summary

from simulations.driver import Simulation
from simulations.scenario import parse_scenario

THRESHOLDS = (0.85, 0.9, 0.94, 0.95, 0.9594, 0.96, 0.9662)
#: benchmarks/crowd.py's generated-1m job, its 60-s budget
JOB_1M = {"job.data.dataset": "classify:1000000", "job.stop.max_time_s": 60}

if __name__ == "__main__":
    sets = JOB_1M | overrides(sys.argv[2:])
    t0 = time.time()
    sim = Simulation(parse_scenario(raw_of(sets)))
    lrs: list[list[float]] = []  # (t, the crowd's lr multiplier)
    _sample = sim._sample

    def _sample_with_lr(reschedule: bool = True) -> None:
        _sample(reschedule)
        lrs.append([sim.engine.now, round(sim.core.strategy.lr_scale(), 4)])

    sim._sample = _sample_with_lr
    r = sim.run()
    out = summary(sys.argv[1], sets, r, THRESHOLDS)
    curve = [(x.t, x.accuracy) for x in r.series if x.accuracy is not None]
    out |= {
        "ended": sim.stop_reason,
        "end_s": curve[-1][0],
        "wall_s": round(time.time() - t0, 1),
        "curve": [[t, a] for t, a in curve],
        "lr_scale": [p for i, p in enumerate(lrs) if i == 0 or p[1] != lrs[i - 1][1]],
    }
    sys.stdout.write(json.dumps(out) + "\n")
