"""Session 16's per-message tally: the crowd of benchmarks/roblox_700.py (the
generated job, roblox links, 64 shards, every player at 2.4e8 FLOP/s) at N
players for V virtual s; from virtual second T on, each frame's count and
bytes by message type per accepted result, and the results per
player-second. It wraps the simulator's send functions (a measurement, not
an API). From the repository root, for example:

    python docs/results/2026-11-29/message_tally.py 700 100 60
    python docs/results/2026-11-29/message_tally.py 64 120 60
"""

import collections
import sys

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
import roblox_700 as rb

from protocol import messages as m
from simulations import player as pl
from simulations.driver import Simulation
from simulations.scenario import parse_scenario

players, virtual_s, t_from = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
sim = Simulation(parse_scenario(rb.scenario(virtual_s, 2.4e8, 64, 20, players)))
tally: collections.Counter[str] = collections.Counter()
count: collections.Counter[str] = collections.Counter()
results = 0


def note(way: str, msg: object, nbytes: int) -> None:
    if sim.engine.now >= t_from:
        key = f"{way} {type(msg).__name__}"
        tally[key] += nbytes
        count[key] += 1


send_down = Simulation._send_down


def _send_down(self, send):
    note("down", send.message, len(send.frame) if send.frame else len(m.encode(send.message)))
    return send_down(self, send)


up = pl.Player._up


def _up(self, msg, nbytes, *, replay=False):
    note("up", msg, nbytes)
    return up(self, msg, nbytes, replay=replay)


Simulation._send_down = _send_down
pl.Player._up = _up
on_result = sim.core.strategy.on_result


def _on_result(task, update, now):
    global results
    results += now >= t_from
    return on_result(task, update, now)


sim.core.strategy.on_result = _on_result
sim.run()
out = [f"results {results}, per player-second {results / players / (virtual_s - t_from):.3f}"]
for k in sorted(tally):
    n, b = count[k] / results, tally[k] / results
    out.append(f"{k:16s} frames {count[k]:7d}, per result {n:5.2f} frames, {b:8.0f} bytes")
sys.stdout.write("\n".join(out) + "\n")
