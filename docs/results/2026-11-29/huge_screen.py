"""One screen of session 19: the ``submodel-huge-64`` crowd alone (the huge preset,
64 roblox players, sub-model tasks) for 600 virtual s with dotted overrides of the
scenario, one JSON line on stdout: the final loss, results, bytes, the virtual
seconds to losses 0.1 / 0.06 / 0.041 (the server's 600-s loss) / 0.036, and the
curve. From the repository root, for example:

    python docs/results/2026-11-29/huge_screen.py h19-up4sr 'job.codecs.update="int4-sr"'
    python docs/results/2026-11-29/huge_screen.py h19-base-seed2 seed=2
"""

import json
import os
import sys
import time

# One compute thread, as roblox_screen.py: two screens side by side on two cores.
os.environ.update(
    {
        v: os.environ.get(v, "1")
        for v in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
    }
)
sys.path.insert(0, ".")

from simulations.driver import Simulation
from simulations.scenario import _set_path, load_raw, parse_scenario, resolve

NAME = "submodel-huge-64"
tag = sys.argv[1]
sets = {k: json.loads(v) for k, v in (kv.split("=", 1) for kv in sys.argv[2:])}
raw = load_raw(resolve(NAME))
raw.pop("sweep", None)
for k, v in sets.items():
    _set_path(raw, k, v)
t0 = time.time()
r = Simulation(parse_scenario(raw, source=NAME)).run()
s = r.summary
curve = [(p.t, p.loss) for p in r.series if p.loss is not None]
out = {
    "tag": tag,
    "set": sets,
    "loss": s["loss"],
    "results": s["results_accepted"],
    "bytes_up": s["bytes_up"],
    "bytes_down": s["bytes_down"],
    "to": {str(x): next((t for t, v in curve if v <= x), None) for x in (0.1, 0.06, 0.041, 0.036)},
    "wall_s": round(time.time() - t0, 1),
    "curve": curve,
}
sys.stdout.write(json.dumps(out) + "\n")
