"""Run a screen script with one stderr line per closed sync round: its number, the
virtual time it closed, its results and slots (session 20: a 700-player round
that took 21.7 s instead of 5.4 s every dozen rounds). E.g.:

    VS=180 python docs/results/2026-11-29/round_close_log.py \\
        docs/results/2026-11-29/roblox_screen.py TAG 700 key=json ...
"""

import runpy
import sys

sys.path.insert(0, ".")
from coordinator.core.strategies import rounds

_close = rounds.RoundStrategy._close


def _logged(self, now):
    sys.stderr.write(
        f"close r{self.round} t={now:.1f} results={len(self.results)} target={self.target}\n"
    )
    return _close(self, now)


rounds.RoundStrategy._close = _logged
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
