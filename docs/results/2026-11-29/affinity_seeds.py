"""The seeds table of docs/performance.md, session 14: the large preset's
defaults row on roblox links, seeds 1-4, at the given ``task_seconds``.

    python docs/results/2026-11-29/affinity_seeds.py job 0.25 1.0    # the job's codecs
    python docs/results/2026-11-29/affinity_seeds.py fp32 0.25 1.0   # slow_link off
"""

import importlib.util
import logging
import sys

sys.path.insert(0, ".")
from simulations.driver import Simulation
from simulations.scenario import parse_scenario

spec = importlib.util.spec_from_file_location("bsim", "benchmarks/simulations.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
logging.disable(logging.WARNING)
codecs = None if sys.argv[1] == "fp32" else bench.JOB_CODECS
for seed in (1, 2, 3, 4):
    for task_seconds in sys.argv[2:]:
        raw = bench._large("roblox", codecs, 0, True, False, bench.DEFAULTS)
        raw["seed"] = seed
        raw["job"]["strategy"]["task_seconds"] = float(task_seconds)
        report = Simulation(parse_scenario(raw)).run()
        pts = [(p.t, p.loss) for p in report.series if p.loss is not None]
        to = {t: next((a for a, loss in pts if loss <= t), None) for t in (0.1, 0.06, 0.04)}
        accepted = report.summary["results_accepted"]
        line = (sys.argv[1], seed, task_seconds, to, accepted, round(pts[-1][1], 4))
        sys.stdout.write(" ".join(map(str, line)) + "\n")
