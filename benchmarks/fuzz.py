"""A million hostile frames against the coordinator's decoder and core, with an
honest client training beside them: frames tried, close codes seen, crashes,
memory before and after, and the honest client's accepted results.

Sans-IO (testkit/fuzzing.py): each frame is decoded as the websocket server
decodes it and handed to the real core; a refused frame closes its connection
with the error's close code and the next frame opens a new one. The honest client
is a real ClientSession computing real updates over the loopback driver. What
this does not cover, ``--server`` does: the frames go over real websockets
(testkit/netfuzz.py: many connections from 127.0.0.0/8, each a valid hello then
hostile frames until the server closes it) to a real ``crowdgrad coordinator``
process, uvicorn, the websocket layer and admission included, while a real
``crowdgrad client`` process trains beside them; the report adds the process's
RSS before and after, whether it is still serving (``/healthz``, no traceback)
and the honest client's accepted results in each tenth of the run.

    .venv/bin/python benchmarks/fuzz.py [--frames 1000000] [--seed 0] [--server] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.append(str(_HERE.parent))  # testkit: in the checkout, not the wheel

from coordinator.core.assembly import build_core  # noqa: E402
from coordinator.core.config import parse_job  # noqa: E402
from testkit.fuzzing import fuzz, summary  # noqa: E402
from testkit.netfuzz import fuzz_server  # noqa: E402
from testkit.soakcheck import rss_mb  # noqa: E402

OPEN_ENDED = """
[model]
widths = [64, 32, 10]
[stop]
max_versions = 1000000000
patience = 0
[eval]
every_versions = 1000
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--server", action="store_true", help="over real sockets to a real process")
    ap.add_argument("--workers", type=int, default=16, help="--server: connections at once")
    args = ap.parse_args()
    if args.server:
        print(json.dumps(server_run(args), indent=None if not args.json else 2))
        return
    job = parse_job(
        {
            "model": {"widths": [64, 32, 10]},
            "stop": {"target_accuracy": None, "max_versions": 10**9, "patience": 0},
            "eval": {"every_versions": 1000},
        }
    )
    # A first, smaller run on another core: numba, caches and malloc arenas settle.
    warm = fuzz(build_core(job, seed=args.seed), 20_000, seed=args.seed + 1)
    core = build_core(job, seed=args.seed)
    before = rss_mb(os.getpid())
    t0 = time.perf_counter()
    report = fuzz(core, args.frames, seed=args.seed)
    out = summary(report) | {
        "seconds": round(time.perf_counter() - t0, 1),
        "rss_mb_before": round(before, 1),
        "rss_mb_after": round(rss_mb(os.getpid()), 1),
        "warmup_crashes": len(warm.crashes),
    }
    out["rss_growth"] = round(out["rss_mb_after"] / out["rss_mb_before"] - 1, 4)
    print(json.dumps(out, indent=None if not args.json else 2))


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def server_run(args: argparse.Namespace) -> dict[str, Any]:
    """Real coordinator and honest client processes; the frames over real sockets."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    http, ws = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}/ws"
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.toml"
        job.write_text(OPEN_ENDED)
        log = (Path(tmp) / "coordinator.log").open("w+")
        run = [sys.executable, "-m", "crowdgrad"]
        coord = subprocess.Popen(
            [*run, "coordinator", "--job", str(job), "--port", str(port), "--no-store"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        honest = None
        try:
            for _ in range(600):
                try:
                    _get(f"{http}/healthz")
                    break
                except OSError:
                    time.sleep(0.1)
            honest = subprocess.Popen(
                [*run, "client", ws, "--name", "honest", "--anonymous", "--no-cache"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            while _get(f"{http}/api/status")["accepted_results"] < 3:
                time.sleep(0.1)
            asyncio.run(fuzz_server(ws, 20_000, seed=args.seed + 1, workers=args.workers))
            before = rss_mb(coord.pid)
            accepted = [_get(f"{http}/api/status")["accepted_results"]]
            rss = [round(before, 1)]
            t0 = time.perf_counter()
            total = None
            tenth = max(1, args.frames // 10)
            for k in range(10):
                part = asyncio.run(
                    fuzz_server(ws, tenth, seed=args.seed + 2 + k, workers=args.workers)
                )
                total = part if total is None else _merge(total, part)
                accepted.append(_get(f"{http}/api/status")["accepted_results"])
                rss.append(round(rss_mb(coord.pid), 1))
            seconds = time.perf_counter() - t0
            after = rss_mb(coord.pid)
            alive = coord.poll() is None and _get(f"{http}/healthz").get("ok") is True
        finally:
            for p in (honest, coord):
                if p is not None and p.poll() is None:
                    p.terminate()
                    p.wait(30)
        log.seek(0)
        crashed = "Traceback" in log.read()
    assert total is not None
    gains = [b - a for a, b in itertools.pairwise(accepted)]
    return total.summary() | {
        "seconds": round(seconds, 1),
        "frames_per_s": round(total.frames / seconds),
        "rss_mb_before": round(before, 1),
        "rss_mb_after": round(after, 1),
        "rss_growth": round(after / before - 1, 4),
        "rss_mb_by_tenth": rss,
        "still_serving": alive,
        "traceback_in_log": crashed,
        "honest_accepted_by_tenth": accepted,
        "honest_accepted_in_every_tenth": all(g > 0 for g in gains),
    }


def _merge(a: Any, b: Any) -> Any:
    a.frames += b.frames
    a.connections += b.connections
    a.kinds.update(b.kinds)
    a.closes.update(b.closes)
    a.refused.update(b.refused)
    a.not_welcomed += b.not_welcomed
    return a


if __name__ == "__main__":
    main()
