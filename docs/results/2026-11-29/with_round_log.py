"""Run a screen script with the per-round log of rounds under outer_lr "auto"
on stderr: each round's outer lr, the plateau's decay, its deltas, the share
of rows they sampled and the running signal and noise (session 18). E.g.:

    python docs/results/2026-11-29/with_round_log.py \\
        docs/results/2026-11-29/roblox_screen.py TAG 8 key=json ...
"""

import logging
import runpy
import sys

logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
logging.getLogger("coordinator.core.strategies.rounds").setLevel(logging.DEBUG)
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
