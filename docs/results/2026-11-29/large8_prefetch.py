"""The large preset's defaults row on roblox links (benchmarks/simulations.py's
``_large("roblox", JOB_CODECS, ...)``, 8 players, seed 1), cut at T virtual s,
with dotted overrides: the times to held-out loss 0.1 and 0.04, results, final
loss. Session 15, from the repository root:

    python docs/results/2026-11-29/large8_prefetch.py default 600
    python docs/results/2026-11-29/large8_prefetch.py served 600 job.lease.prefetch=true
    python docs/results/2026-11-29/large8_prefetch.py off 600 job.lease.prefetch=false
"""

import json
import sys
import time

sys.path.insert(0, ".")
from simulations.driver import Simulation
from simulations.scenario import _set_path, parse_scenario
from tests.bench_module import load_benchmark

bench = load_benchmark("simulations")
tag, horizon = sys.argv[1], float(sys.argv[2])
raw = bench._large("roblox", bench.JOB_CODECS, 0, True, False, bench.DEFAULTS)
raw["run"]["max_virtual_s"] = horizon
for kv in sys.argv[3:]:
    k, v = kv.split("=", 1)
    _set_path(raw, k, json.loads(v))
t0 = time.time()
r = Simulation(parse_scenario(raw)).run()
pts = [(p.t, p.loss) for p in r.series if p.loss is not None]
to = {str(th): next((t for t, loss in pts if loss <= th), None) for th in (0.1, 0.04)}
results = r.summary["results_accepted"]
wall = round(time.time() - t0, 1)
best = min(x for _, x in pts)
sys.stdout.write(f"{tag} to {to} min {best} final {pts[-1]} results {results} wall {wall}\n")
