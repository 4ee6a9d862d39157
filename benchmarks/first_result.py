"""Time from a client's ``hello`` to its first accepted result, with a cold and a
warm shard cache, on the lan and roblox link profiles (digits job).

A real coordinator (in this process, real websockets on loopback, the link's
pacing) and one real ``crowdgrad client`` process per run. The clock starts when
the core takes the client's ``hello`` (``ClientJoined``) and stops when it accepts
that client's first result (``ResultAccepted``): the start-up of the client
process (imports, FLOP/s measurement) is outside both ends, so every row counts
the same work: welcome, the task, its model (or seeded init), its shard, the
compute and the upload.

- ``cold``: an empty ``--cache-dir``: the shard comes over the websocket as
  ``data`` frames, paced like everything else.
- ``warm``: the cache already holds every shard of the job (a second run).
- ``own data`` (the anchor): ``--no-data-fetch``: the client names no shard and
  loads digits from its own scikit-learn install when its first task arrives, as
  every client did before shards were served (the import and the load are inside
  the measured time, as the shard's transfer is for ``cold``).

    .venv/bin/python benchmarks/first_result.py [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# Run as a script, this file's folder is sys.path[0] and would shadow the
# ``protocol`` package with benchmarks/protocol.py.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from client.datacache import DiskCache  # noqa: E402
from coordinator.core import events as ev  # noqa: E402
from coordinator.core.config import parse_job  # noqa: E402
from coordinator.http.server import CrowdServer  # noqa: E402
from coordinator.http.serving import BackgroundServer  # noqa: E402
from coordinator.runtime.service import CoreService  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODES = ("cold", "warm", "own data")


class _Clock:
    """First ClientJoined and first ResultAccepted times per client, from the core."""

    def __init__(self) -> None:
        self.joined: dict[str, float] = {}
        self.first: dict[str, float] = {}
        self.data_bytes = 0
        self.done = threading.Event()

    def __call__(self, outputs: list[ev.Output]) -> None:
        for o in outputs:
            if isinstance(o, ev.ClientJoined):
                self.joined.setdefault(o.client_id, o.now)
            elif isinstance(o, ev.ResultAccepted) and o.client_id not in self.first:
                self.first[o.client_id] = o.now
                self.done.set()
            elif isinstance(o, ev.DataServed):
                self.data_bytes += o.nbytes


def one_run(profile: str, mode: str, cache: Path) -> dict:
    job = parse_job(
        {
            "model": {"widths": [64, 128, 10]},
            "link": {"profile": profile},
            "stop": {"target_accuracy": None, "max_versions": 10_000},
        }
    )
    service = CoreService(job)
    clock = _Clock()
    service.add_sink(clock)
    with BackgroundServer(CrowdServer(service)) as bg:
        assert service.core is not None
        if mode == "warm":
            disk = DiskCache(cache)
            for s in service.core.data.shards:
                disk.put(s.sha256, s.blob)
        extra = ["--no-data-fetch"] if mode == "own data" else ["--cache-dir", str(cache)]
        env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "crowdgrad", "client", bg.url, "--flops", "1e9", *extra]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
        try:
            if not clock.done.wait(120):
                raise RuntimeError(f"{profile}/{mode}: no result within 120 s")
        finally:
            proc.kill()
            proc.wait(30)
    (cid,) = clock.first
    return {"seconds": clock.first[cid] - clock.joined[cid], "shard_bytes": clock.data_bytes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="runs per row (median shown)")
    ap.add_argument("--profiles", default="lan,roblox")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for profile in args.profiles.split(","):
        for mode in MODES:
            runs = []
            for _ in range(args.rounds):
                with tempfile.TemporaryDirectory() as tmp:
                    runs.append(one_run(profile, mode, Path(tmp)))
            secs = [r["seconds"] for r in runs]
            rows.append(
                {
                    "profile": profile,
                    "cache": mode,
                    "median_s": statistics.median(secs),
                    "min_s": min(secs),
                    "max_s": max(secs),
                    "shard_bytes": runs[0]["shard_bytes"],
                }
            )
    anchor = {r["profile"]: r["median_s"] for r in rows if r["cache"] == "own data"}
    for r in rows:
        r["vs_own_data"] = r["median_s"] / anchor[r["profile"]]
    if args.json:
        print(json.dumps({"rounds": args.rounds, "rows": rows}, indent=2))
        return
    t = Table(title="hello -> first accepted result, digits [64, 128, 10], one client")
    for col in ("profile", "cache", "median s", "min-max s", "shard bytes", "x own data"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            r["profile"],
            r["cache"],
            f"{r['median_s']:.3f}",
            f"{r['min_s']:.3f}-{r['max_s']:.3f}",
            f"{r['shard_bytes']:,}",
            f"{r['vs_own_data']:.2f}",
        )
    Console().print(t)


if __name__ == "__main__":
    main()
