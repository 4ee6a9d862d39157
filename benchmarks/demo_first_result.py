"""Time from ``crowdgrad demo`` to its first accepted result, cold and warm.

What a newcomer waits for after typing ``make demo``: the demo process starts,
serves, starts its client processes and builds the coordinator; the first result
a client uploads is accepted. Measured from outside, from the moment the command
is launched to the moment the demo's line "first result accepted" reaches its
stdout, and also as the demo reports it itself (it counts from its own process
start, imports included).

Cold: a numba cache directory nobody has used (``NUMBA_CACHE_DIR``), so every
kernel compiles, as on the first run after an install. Warm: the same directory
again, as on every later run. Python's own bytecode caches stay warm in both
(they exist after ``pip install``).

    .venv/bin/python benchmarks/demo_first_result.py --rounds 3 [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIRST = "first result accepted"
SELF_REPORTED = re.compile(r"first accepted result at ([0-9.]+) s")
FINISHED = re.compile(r"after the command started")


def run_demo(cache_dir: str, timeout: float) -> dict[str, float | None]:
    """One ``crowdgrad demo``: seconds to the first accepted result (outside and
    self-reported), to the end of the job, and the command's whole wall time."""
    env = {
        **os.environ,
        "NUMBA_CACHE_DIR": cache_dir,
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "200",  # one line per message: nothing wraps a phrase apart
    }
    cmd = [sys.executable, "-m", "crowdgrad", "demo", "--no-wait"]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    first = finished = reported = None
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        now = time.monotonic() - t0
        if first is None and FIRST in line:
            first = now
        if finished is None and FINISHED.search(line):
            finished = now
        if m := SELF_REPORTED.search(line):
            reported = float(m.group(1))
        if now > timeout:
            proc.kill()
            break
    rc = proc.wait()
    wall = time.monotonic() - t0
    if rc != 0 or first is None:
        sys.stderr.write("".join(lines[-40:]))
        raise SystemExit(f"demo failed (exit {rc})")
    return {"first_result_s": first, "reported_s": reported, "summary_s": finished, "wall_s": wall}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="warm runs (one cold run first)")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="crowdgrad-numba-") as cache:
        cold = run_demo(cache, args.timeout)
        warm = [run_demo(cache, args.timeout) for _ in range(args.rounds)]
    result = {"cold": cold, "warm": warm}
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
        return 0

    def row(name: str, runs: list[dict[str, float | None]]) -> str:
        cells = []
        for key in ("first_result_s", "reported_s", "wall_s"):
            vals = [float(r[key]) for r in runs if r[key] is not None]
            med = statistics.median(vals)
            cells.append(
                f"{med:.1f} s ({min(vals):.1f}-{max(vals):.1f})"
                if len(vals) > 1
                else f"{med:.1f} s"
            )
        return f"| {name} | " + " | ".join(cells) + " |"

    print("| cache | launch -> first accepted result | as the demo reports it | whole command |")
    print("|---|---|---|---|")
    print(row("cold (1 run)", [cold]))
    print(row(f"warm ({len(warm)} runs)", warm))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
