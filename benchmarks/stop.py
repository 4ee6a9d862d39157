"""SIGTERM at random moments: does `crowdgrad coordinator` always end in its grace?

Each try starts a real coordinator (with a store, so a final checkpoint is
written when it gets that far), waits a seeded random time from 0 to
``--window`` seconds after spawn (start-up, the banner, serving), sends one
SIGTERM and measures how long the process takes to end. Reported: tries, how
many ended within ``--grace`` (the command's ``--stop-grace``, 10 s), exit
codes, the slowest exit, and how many left a loadable checkpoint.

    .venv/bin/python benchmarks/stop.py --tries 50 --json
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this file's folder is sys.path[0] and would shadow the
# ``storage`` package with benchmarks/storage.py.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]


def one_try(delay: float, store: Path, grace: float) -> dict:
    cmd = [sys.executable, "-m", "crowdgrad", "coordinator", "--port", "0",
           "--widths", "64,16,10", "--store", str(store), "--stop-grace", str(grace)]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(delay)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(grace + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
        return {"delay": delay, "exit_s": None, "code": code, "checkpoint": False}
    return {
        "delay": round(delay, 3),
        "exit_s": round(time.monotonic() - t0, 3),
        "code": code,
        "checkpoint": has_checkpoint(store),
    }


def has_checkpoint(store: Path) -> bool:
    """Whether the store holds a loadable checkpoint (a SIGTERM before the store
    was opened leaves none, and needs none: nothing was acknowledged)."""
    from storage.store import CheckpointStore

    if not store.exists():
        return False
    try:
        with CheckpointStore.open(store) as s:
            return s.load_latest() is not None
    except Exception:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=50)
    ap.add_argument("--window", type=float, default=6.0, help="latest SIGTERM after spawn, s")
    ap.add_argument("--grace", type=float, default=10.0, help="--stop-grace of each coordinator")
    ap.add_argument("--seed", type=int, default=34)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.tries < 1 or args.window < 0 or args.grace <= 0:
        ap.error("--tries must be >= 1, --window >= 0 and --grace > 0")
    rng = random.Random(args.seed)
    rows = []
    with tempfile.TemporaryDirectory(prefix="stop-bench-") as tmp:
        for i in range(args.tries):
            rows.append(one_try(rng.uniform(0, args.window), Path(tmp) / f"s{i}.db", args.grace))
    ended = [r for r in rows if r["exit_s"] is not None and r["exit_s"] <= args.grace]
    report = {
        "tries": len(rows),
        "ended_within_grace": len(ended),
        "slowest_exit_s": max((r["exit_s"] or float("inf")) for r in rows),
        "codes": dict(Counter(r["code"] for r in rows)),
        "with_checkpoint": sum(r["checkpoint"] for r in rows),
        "rows": rows,
    }
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print({k: v for k, v in report.items() if k != "rows"})


if __name__ == "__main__":
    main()
