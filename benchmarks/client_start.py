"""Time from launching a desktop client process to its first task computing and its
first accepted result, cold and warm, phase by phase.

A real coordinator (the default job: digits, [64, 128, 10], shards served by the
coordinator) runs in this process and is ready before the clock starts; then one
real ``crowdgrad client URL`` process is launched with the client's own
defaults (it measures its FLOP/s, no ``--flops``). The clock starts just before
the launch. Time stamps, all on the machine's monotonic clock (shared by both
processes):

- ``interpreter``: the client process runs its first line (Python and ``site``);
- ``imports``: ``client.desktop`` and the command line's console imported;
- ``flops``: the client has its FLOP/s: measured by the start-up probe (its first
  call loads or compiles the training kernels), or, on a warm run, kept in the
  cache folder by the run before (client/flops.py: then the kernels load at the
  first task);
- ``hello``: the coordinator's core took the client's ``hello`` (``ClientJoined``);
- ``task``: the core leased it its first task (``TaskLeased``);
- ``computing``: the client's compute thread started the task (``run_task``);
- ``computed``: the task's update is computed;
- ``accepted``: the core accepted the result (``ResultAccepted``).

Where the core's events cannot say it (the first three and the compute), the
client process is launched as ``python -c`` with a few lines that stamp the time,
wrap ``measure_flops`` and ``run_task`` to stamp their ends, then run
``crowdgrad.cli.main`` as ``crowdgrad client URL`` does (the imports of its
parser fall in the ``flops`` phase). ``--entry module`` runs ``client.desktop``
as ``__main__`` instead, as ``python -m client.desktop`` did: for a
``--client-root`` checkout from before the command line left ``client/``.

- ``cold``: an empty ``NUMBA_CACHE_DIR`` (every kernel the client uses compiles,
  as on the first run after an install) and an empty cache folder (shards, the
  FLOP/s measurement).
- ``warm``: the same two directories again, as on every later run.

Python's bytecode caches are warm in both, as after ``pip install`` (which
compiles them): the client writes them under a ``PYTHONPYCACHEPREFIX`` of this
run, filled before the first clock starts, whatever ``PYTHONDONTWRITEBYTECODE``
says. ``--client-root DIR`` runs the client from another checkout (an older
commit, to measure before and after a change) against this one's coordinator.

    .venv/bin/python benchmarks/client_start.py [--rounds 3] [--json] [--entry module|cli]
        [--client-root DIR]
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
import time
from pathlib import Path

# Run as a script, this file's folder is sys.path[0] and would shadow the
# ``protocol`` package with benchmarks/protocol.py.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from coordinator.core import events as ev  # noqa: E402
from coordinator.core.config import parse_job  # noqa: E402
from coordinator.http.server import CrowdServer  # noqa: E402
from coordinator.http.serving import BackgroundServer  # noqa: E402
from coordinator.runtime.service import CoreService  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("interpreter", "imports", "flops", "hello", "task", "computing", "computed", "accepted")

#: The client process: stamps around ``crowdgrad client``'s own work.
_CLIENT = """
import time; _t0 = time.monotonic()
import os, runpy, sys
_out = open(os.environ["CROWDGRAD_START_STAMPS"], "a", buffering=1)
def _stamp(name, t=None):
    _out.write(f"{name} {time.monotonic() if t is None else t!r}\\n")
_stamp("interpreter", _t0)
import client.desktop as d, crowdgrad.commands.client
_stamp("imports")
def _wrap(f, first, last):
    seen = []
    def g(*a, **k):
        if not seen and first:
            _stamp(first)
        out = f(*a, **k)
        if not seen:
            seen.append(1)
            _stamp(last)
        return out
    return g
if hasattr(d.DesktopClient, "_measure_flops"):  # measured, or kept from a run before
    d.DesktopClient._measure_flops = _wrap(d.DesktopClient._measure_flops, None, "flops")
else:  # a checkout from before the measurement was kept (--client-root)
    d.measure_flops = _wrap(d.measure_flops, None, "flops")
d.run_task = _wrap(d.run_task, "computing", "computed")
if os.environ["CROWDGRAD_START_ENTRY"] == "cli":
    from crowdgrad.cli import main
    sys.exit(main(["client", *sys.argv[1:]]))
sys.argv = ["client.desktop", *sys.argv[1:]]
runpy.run_module("client.desktop", run_name="__main__", alter_sys=True)
"""


class _Clock:
    """The core's first ClientJoined, TaskLeased and ResultAccepted times."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget the last run (between runs: the core is quiet then)."""
        self.at: dict[str, float] = {}
        self.done = threading.Event()

    def __call__(self, outputs: list[ev.Output]) -> None:
        for o in outputs:
            if isinstance(o, ev.ClientJoined):
                self.at.setdefault("hello", o.now)
            elif isinstance(o, ev.TaskLeased):
                self.at.setdefault("task", o.now)
            elif isinstance(o, ev.ResultAccepted):
                self.at.setdefault("accepted", o.now)
                self.done.set()


def client_env(pycache: Path) -> dict[str, str]:
    """The client's environment: its bytecode cached under ``pycache``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": str(pycache)}


def one_run(
    url: str,
    clock: _Clock,
    root: Path,
    env: dict[str, str],
    dirs: tuple[Path, Path],
    timeout: float,
) -> dict:
    """One client process (from ``root``) from launch to its first accepted result:
    seconds since launch of each stamp. ``dirs``: its numba and shard caches."""
    with tempfile.NamedTemporaryFile("r", suffix=".stamps") as stamps:
        env = {**env, "NUMBA_CACHE_DIR": str(dirs[0]), "CROWDGRAD_START_STAMPS": stamps.name}
        cmd = [sys.executable, "-c", _CLIENT, url, "--cache-dir", str(dirs[1]), "-q"]
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            if not clock.done.wait(timeout):
                raise RuntimeError(f"no result within {timeout} s")
        finally:
            proc.kill()
            _, err = proc.communicate(timeout=30)
        at = dict(clock.at)
        for line in Path(stamps.name).read_text().splitlines():
            name, t = line.split()
            at[name] = float(t)
    missing = [p for p in PHASES if p not in at]
    if missing:
        sys.stderr.write(err.decode(errors="replace")[-4000:])
        raise RuntimeError(f"the run left no stamp for {missing}")
    return {p: at[p] - t0 for p in PHASES}


def measure(
    rounds: int, timeout: float, root: Path = ROOT, entry: str = "module"
) -> dict[str, list[dict]]:
    """``rounds`` pairs of a cold run and a warm run against one coordinator."""
    job = parse_job({"stop": {"target_accuracy": None, "max_versions": 1_000_000, "patience": 0}})
    service = CoreService(job)
    clock = _Clock()
    service.add_sink(clock)
    runs: dict[str, list[dict]] = {"cold": [], "warm": []}
    with (
        tempfile.TemporaryDirectory(prefix="crowdgrad-pycache-") as pycache,
        BackgroundServer(CrowdServer(service)) as bg,
    ):
        env = {**client_env(Path(pycache)), "CROWDGRAD_START_ENTRY": entry}
        prime = "import client.desktop, crowdgrad.commands.client"
        subprocess.run([sys.executable, "-c", prime], cwd=root, env=env, check=True)
        for _ in range(rounds):
            with tempfile.TemporaryDirectory(prefix="crowdgrad-start-") as tmp:
                dirs = (Path(tmp, "numba"), Path(tmp, "shards"))
                for mode in ("cold", "warm"):
                    clock.reset()
                    runs[mode].append(one_run(bg.url, clock, root, env, dirs, timeout))
    return runs


def summarise(runs: list[dict]) -> dict:
    """Median (and min, max) seconds since launch per stamp, and per phase."""
    at = {p: statistics.median(r[p] for r in runs) for p in PHASES}
    spans = {
        p: statistics.median(r[p] - (r[PHASES[i - 1]] if i else 0.0) for r in runs)
        for i, p in enumerate(PHASES)
    }
    first = [r["computing"] for r in runs]
    return {
        "runs": len(runs),
        "since_launch_s": at,
        "phase_s": spans,
        "computing_min_max_s": [min(first), max(first)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="cold + warm pairs (medians shown)")
    ap.add_argument("--timeout", type=float, default=600.0, help="per run, seconds")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--client-root", type=Path, default=ROOT, help="run the client from here")
    ap.add_argument(
        "--entry",
        choices=("module", "cli"),
        default="cli",
        help="crowdgrad client (default) or python -m client.desktop (an older --client-root)",
    )
    args = ap.parse_args()
    load_before = os.getloadavg()
    runs = measure(args.rounds, args.timeout, args.client_root.resolve(), args.entry)
    out = {
        "rounds": args.rounds,
        "entry": args.entry,
        "client_root": str(args.client_root),
        "load_average": {"start": list(load_before), "end": list(os.getloadavg())},
        **{mode: summarise(rs) for mode, rs in runs.items()},
    }
    if args.json:
        print(json.dumps({**out, "raw": runs}, indent=2))
        return
    load = " -> ".join(f"{la[0]:.2f}" for la in out["load_average"].values())
    print(f"client start ({args.entry}), median of {args.rounds}; load average {load}")
    print(f"{'phase':<12} {'cold s':>8} {'warm s':>8}   (seconds in the phase; since launch)")
    for p in PHASES:
        c, w = out["cold"], out["warm"]
        print(
            f"{p:<12} {c['phase_s'][p]:8.3f} {w['phase_s'][p]:8.3f}"
            f"   ({c['since_launch_s'][p]:.3f}; {w['since_launch_s'][p]:.3f})"
        )


if __name__ == "__main__":
    main()
