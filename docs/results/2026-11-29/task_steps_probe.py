"""How long the default's tasks are, in local steps, and the lr multiplier each
took (session 22): runs a scenario with ``TaskIssuer.sized`` hooked and prints
one JSON line, the tasks counted by steps (in buckets of 50) and by multiplier.
From the repository root:

    python docs/results/2026-11-29/task_steps_probe.py roblox 64 300
    python docs/results/2026-11-29/task_steps_probe.py lan 14 5

``roblox N S``: the crowd of benchmarks/roblox_700.py (as roblox_screen.py) at N
players for S virtual s; ``lan N S``: ``generated-crowd`` on the 1,000,000-row job
(as lan16_screen.py, first connects over 1.3 s) with N clients for S virtual s.
"""

import collections
import json
import os
import sys

# one compute thread each, as roblox_screen.py (two runs side by side otherwise spin)
os.environ.update(
    {
        v: os.environ.get(v, "1")
        for v in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
    }
)
sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
import roblox_700 as rb
from lan16_screen import JOB_1M
from lan_screen import raw_of

from coordinator.core.issuing import TaskIssuer
from simulations.driver import Simulation
from simulations.scenario import parse_scenario

link, players, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
if link == "roblox":
    raw = rb.scenario(seconds, 2.4e8, 64, 20, players)
else:
    sets = {"clients.count": players, "clients.join_over_s": 1.3}
    raw = raw_of(JOB_1M | sets | {"job.stop.max_time_s": seconds})
steps: collections.Counter = collections.Counter()
scales: collections.Counter = collections.Counter()
sized = TaskIssuer.sized


def counted(self, *args, **kwargs):
    plan = sized(self, *args, **kwargs)
    steps[plan.steps // 50 * 50] += 1
    scales[round(plan.lr_scale, 2)] += 1
    return plan


TaskIssuer.sized = counted
Simulation(parse_scenario(raw)).run()
out = {
    "link": link,
    "players": players,
    "virtual_s": seconds,
    "tasks_by_steps": dict(sorted(steps.items())),
    "tasks_by_multiplier": dict(sorted(scales.items())),
}
sys.stdout.write(json.dumps(out) + "\n")
