"""A million hostile frames against the coordinator's decoder and core, with an
honest client training beside them: frames tried, close codes seen, crashes,
memory before and after, and the honest client's accepted results.

Sans-IO (testkit/fuzzing.py): each frame is decoded as the websocket server
decodes it and handed to the real core; a refused frame closes its connection
with the error's close code and the next frame opens a new one. The honest client
is a real ClientSession computing real updates over the loopback driver. What
this does not cover, the real-socket fuzz in tests/e2e/test_bad_input.py does
(websocket framing, oversized frames, slow readers).

    .venv/bin/python benchmarks/fuzz.py [--frames 1000000] [--seed 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.append(str(_HERE.parent))  # testkit: in the checkout, not the wheel

from coordinator.core.assembly import build_core  # noqa: E402
from coordinator.core.config import parse_job  # noqa: E402
from testkit.fuzzing import fuzz, summary  # noqa: E402


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    job = parse_job(
        {
            "model": {"widths": [64, 32, 10]},
            "stop": {"target_accuracy": None, "max_versions": 10**9},
            "eval": {"every_versions": 1000},
        }
    )
    # A first, smaller run on another core: numba, caches and malloc arenas settle.
    warm = fuzz(build_core(job, seed=args.seed), 20_000, seed=args.seed + 1)
    core = build_core(job, seed=args.seed)
    before = rss_mb()
    t0 = time.perf_counter()
    report = fuzz(core, args.frames, seed=args.seed)
    out = summary(report) | {
        "seconds": round(time.perf_counter() - t0, 1),
        "rss_mb_before": round(before, 1),
        "rss_mb_after": round(rss_mb(), 1),
        "warmup_crashes": len(warm.crashes),
    }
    out["rss_growth"] = round(out["rss_mb_after"] / out["rss_mb_before"] - 1, 4)
    print(json.dumps(out, indent=None if not args.json else 2))


if __name__ == "__main__":
    main()
