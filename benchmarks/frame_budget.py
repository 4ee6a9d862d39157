"""A 60 Hz game loop beside the desktop client, and with the in-game client inside it.

The game is ``examples/ingame_loop.py`` in a process of its own: each frame
``--work-ms`` of busy CPU, then (in-game rows) ``client.step(budget)``, then a
sleep to the next tick; a frame's time is start to start. Beside it, per row:

- ``none``: the loop alone (the anchor);
- ``desktop``: a real ``crowdgrad client`` process at a ``--cpu-share`` and a
  ``--priority`` (idle is the default), started and past its first results
  before the loop starts;
- ``ingame``: no desktop client; the game's own thread gives ``budget`` ms a
  frame to an :class:`client.ingame.InGameClient`.

Each row gets a fresh coordinator in this process (real websockets on loopback)
on digits with a [64, 512, 512, 10] MLP, decentral-async, ``--tau`` 500 steps
of batch 16 a task (14 GFLOP, ~0.25 s on one core), so the client is CPU-bound.
The coordinator's threads run at ``--coordinator-nice`` 19: it stands for
another machine (``0`` makes it compete like the rest of a busy player's
machine, as issue 23's own table had it). Per row: frame p50 / p99 / max, frames
over 20 ms, the coordinator's accepted results per second while the loop
measured, optimizer steps per second (results x tau; the in-game client counts
its own), their ratio to the normal-priority desktop client's, and the CPU that
processes outside the benchmark used meanwhile (``other load``, cores): an
idle-priority client yields to those too, so a row with other load is not
comparable (``--quiet-wait`` starts each row in a lull).

    .venv/bin/python benchmarks/frame_budget.py [--seconds 15] [--quiet-wait 60] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's folder is sys.path[0] and would shadow the
# ``protocol`` package with benchmarks/protocol.py.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from coordinator.core import events as ev  # noqa: E402
from coordinator.core.config import parse_job  # noqa: E402
from coordinator.http.server import CrowdServer  # noqa: E402
from coordinator.http.serving import BackgroundServer  # noqa: E402
from coordinator.runtime.service import CoreService  # noqa: E402
from nn.threads import set_threads  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GAME = ROOT / "examples" / "ingame_loop.py"
WIDTHS = [64, 512, 512, 10]
#: Steps a task (the job's tau): a task of ~0.25 s, so the coordinator's work per
#: result (~50 ms of CPU for this model) is small beside the client's.
TAU = 500

#: (label, kind, cpu share or budget ms, priority)
CONFIGS: tuple[tuple[str, str, float, str], ...] = (
    ("none", "none", 0.0, ""),
    ("desktop normal 1.0", "desktop", 1.0, "normal"),
    ("desktop idle 1.0 (default)", "desktop", 1.0, "idle"),
    ("desktop normal 0.5", "desktop", 0.5, "normal"),
    ("desktop idle 0.5", "desktop", 0.5, "idle"),
    ("desktop normal 0.25", "desktop", 0.25, "normal"),
    ("ingame 2 ms", "ingame", 2.0, ""),
    ("ingame 4 ms", "ingame", 4.0, ""),
    ("ingame 8 ms", "ingame", 8.0, ""),
)
#: Rows only ``--only`` runs: the whole client process under a scheduler wrapper.
EXTRA: dict[str, tuple[str, float, str, tuple[str, ...]]] = {
    "desktop normal 1.0 under chrt -i 0": ("desktop", 1.0, "normal", ("chrt", "-i", "0")),
    "desktop normal 1.0 under nice -n 19": ("desktop", 1.0, "normal", ("nice", "-n", "19")),
}


class _Accepted:
    """Times of every accepted (non-replica) result, from the core's clock."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.first = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, outputs: list[ev.Output]) -> None:
        for o in outputs:
            if isinstance(o, ev.ResultAccepted) and not o.replica:
                with self._lock:
                    self.times.append(o.now)
                    if len(self.times) >= 2:
                        self.first.set()

    def between(self, t0: float, t1: float) -> int:
        with self._lock:
            return sum(1 for t in self.times if t0 <= t <= t1)


def _busy_s() -> float:
    """CPU seconds every CPU spent on anything but idle and iowait (``/proc/stat``)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def _proc_s(pid: int) -> float:
    """User + system CPU seconds of a running process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_s() -> float:
    """CPU seconds of this process and its reaped children (the game loops)."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def wait_quiet(limit_s: float, *, cores: float = 0.15, window_s: float = 2.0) -> float:
    """Wait (at most ``limit_s``) until processes other than this one used less than
    ``cores`` over ``window_s``: on a shared machine a row then starts in a lull.
    Returns the load seen last (cores; 0 without waiting)."""
    if limit_s <= 0:
        return 0.0
    deadline = time.monotonic() + limit_s
    while True:
        t0, busy0, own0 = time.monotonic(), _busy_s(), _own_s() + _background_s()
        time.sleep(window_s)
        own = _own_s() + _background_s() - own0
        load = (_busy_s() - busy0 - own) / (time.monotonic() - t0)
        if load < cores or time.monotonic() >= deadline:
            return load


def _start_niced(bg: BackgroundServer, nice: int) -> BackgroundServer:
    """Start the coordinator's threads at ``nice``. By default 19: in a deployment
    the coordinator is another machine; here, at normal priority, its work for the
    client (a model encoded and a result checked every task) would delay the
    game's frames and be counted against the client. Linux nice is per thread and
    inherited by the threads a thread starts, so the server started from a niced
    thread is niced and the processes started from the main thread (the game, the
    client) are not.
    """
    err: list[BaseException] = []

    def start() -> None:
        try:
            if nice:
                os.setpriority(os.PRIO_PROCESS, 0, nice)
            bg.start()
        except BaseException as exc:  # re-raised on the caller's thread
            err.append(exc)

    t = threading.Thread(target=start, name="niced-start")
    t.start()
    t.join()
    if err:
        raise err[0]
    return bg


#: ``--background``: busy processes at normal priority for the whole run
BACKGROUND: list[subprocess.Popen[bytes]] = []


def _background_s() -> float:
    return sum(_proc_s(p.pid) for p in BACKGROUND)


def _env() -> dict[str, str]:
    env = {**os.environ, "CROWDGRAD_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    env["OMP_NUM_THREADS"] = "1"
    return env


def one_row(
    label: str,
    kind: str,
    value: float,
    priority: str,
    args: argparse.Namespace,
    wrapper: tuple[str, ...] = (),
) -> dict[str, Any]:
    job = parse_job(
        {
            "model": {"widths": WIDTHS},
            "strategy": {"name": "decentral-async", "tau": args.tau, "lr": 0.05},
            "eval": {"every_versions": 1_000_000},
            "stop": {"target_accuracy": None, "max_versions": 10_000_000, "patience": 0},
        }
    )
    service = CoreService(job)
    accepted = _Accepted()
    service.add_sink(accepted)
    desk: subprocess.Popen[bytes] | None = None
    bg = _start_niced(BackgroundServer(CrowdServer(service)), args.coordinator_nice)
    try:
        try:
            game = [sys.executable, str(GAME), "--json", "--hz", str(args.hz)]
            game += ["--work-ms", str(args.work_ms), "--seconds", str(args.seconds)]
            if kind == "desktop":
                cmd = [*wrapper, sys.executable, "-m", "crowdgrad", "client", bg.url]
                cmd += ["--name", "desk"]
                cmd += ["--cpu-share", str(value), "--priority", priority, "--no-cache"]
                desk = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stderr=subprocess.DEVNULL)
                if not accepted.first.wait(120):
                    raise RuntimeError(f"{label}: the desktop client sent no results in 120 s")
                game += ["--warmup-s", "1"]
            elif kind == "ingame":
                game += [bg.url, "--budget-ms", str(value), "--warmup-s", "2"]
            else:
                game += ["--warmup-s", "1"]
            # Load from outside this benchmark during the row (another user's work
            # competes with an idle-priority client and with the game alike).
            t0, busy0, own0 = time.monotonic(), _busy_s(), _own_s()
            desk0 = (_proc_s(desk.pid) if desk is not None else 0.0) + _background_s()
            out = subprocess.run(
                game, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300
            )
            desk_s = (_proc_s(desk.pid) if desk is not None else 0.0) + _background_s() - desk0
            others = _busy_s() - busy0 - (_own_s() - own0) - desk_s
            others_cores = max(0.0, others) / (time.monotonic() - t0)
            if out.returncode != 0:
                raise RuntimeError(f"{label}: game loop failed:\n{out.stderr[-2000:]}")
            res = json.loads(out.stdout.strip().splitlines()[-1])
        finally:
            if desk is not None:
                desk.send_signal(signal.SIGINT)
                try:
                    desk.wait(15)
                except subprocess.TimeoutExpired:
                    desk.kill()
                    desk.wait(15)
    finally:
        bg.stop()
    span = res["t1"] - res["t0"]
    n = accepted.between(res["t0"], res["t1"])
    row = {
        "config": label,
        "kind": kind,
        "share_or_budget_ms": value,
        "priority": priority or None,
        **{k: res[k] for k in ("frames", "p50_ms", "p99_ms", "max_ms", "over_20ms")},
        "results": n if kind != "none" else None,
        "results_per_s": round(n / span, 2) if kind != "none" else None,
        # optimizer steps: results x tau, or counted by the in-game client itself
        "steps_per_s": (
            res["client"]["steps_per_s"]
            if "client" in res
            else (round(n * args.tau / span, 1) if kind != "none" else None)
        ),
        "other_load_cores": round(others_cores, 2),
    }
    if "client" in res:
        row["ingame"] = res["client"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=15.0, help="measured seconds per row")
    ap.add_argument("--hz", type=float, default=60.0, help="the game's frame rate")
    ap.add_argument("--work-ms", type=float, default=6.0, help="the game's work per frame")
    ap.add_argument("--tau", type=int, default=TAU, help=f"steps a task ({TAU})")
    ap.add_argument("--only", help="comma-separated row labels (default: all)")
    ap.add_argument(
        "--coordinator-nice",
        type=int,
        default=19,
        metavar="N",
        help="nice of the coordinator's threads (19: it stands for another machine; "
        "0: it competes like the rest of a busy player machine)",
    )
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        metavar="S",
        help="before each row wait up to S s for other processes to use < 0.15 cores",
    )
    ap.add_argument(
        "--background",
        type=int,
        default=0,
        metavar="N",
        help="N busy-loop processes at normal priority beside everything (the rest of "
        "a busy player's machine: a browser, a call)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    set_threads(1)  # the coordinator's BLAS in the caller's (niced) thread, no pool
    only = None if args.only is None else {s.strip() for s in args.only.split(",")}
    rows = []
    started = time.monotonic()
    wait_quiet(args.quiet_wait)  # before the background starts
    for _ in range(args.background):
        BACKGROUND.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
    try:
        for label, kind, value, priority in CONFIGS:
            if only is not None and label not in only:
                continue
            wait_quiet(args.quiet_wait)
            rows.append(one_row(label, kind, value, priority, args))
        for label, (kind, value, priority, wrapper) in EXTRA.items():
            if only is not None and label in only:
                wait_quiet(args.quiet_wait)
                rows.append(one_row(label, kind, value, priority, args, wrapper))
    finally:
        for p in BACKGROUND:
            p.kill()
            p.wait()
    anchor = next((r["steps_per_s"] for r in rows if r["config"] == "desktop normal 1.0"), None)
    for r in rows:
        sps = r["steps_per_s"]
        r["vs_desktop_normal"] = round(sps / anchor, 3) if sps is not None and anchor else None
    meta = {
        "hz": args.hz,
        "work_ms": args.work_ms,
        "seconds": args.seconds,
        "model": WIDTHS,
        "tau": args.tau,
        "coordinator_nice": args.coordinator_nice,
        "background": args.background,
        "cores": os.cpu_count(),
        "wall_s": round(time.monotonic() - started, 1),
    }
    if args.json:
        print(json.dumps({**meta, "rows": rows}, indent=2))
        return
    t = Table(title=f"{args.hz:g} Hz loop, {args.work_ms:g} ms work a frame, {args.seconds:g} s")
    cols = (
        "client",
        "p50 ms",
        "p99 ms",
        "max ms",
        "> 20 ms",
        "results/s",
        "steps/s",
        "x normal",
        "other load",
    )
    for col in cols:
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            r["config"],
            f"{r['p50_ms']:.2f}",
            f"{r['p99_ms']:.2f}",
            f"{r['max_ms']:.2f}",
            f"{r['over_20ms']} / {r['frames']}",
            "-" if r["results_per_s"] is None else f"{r['results_per_s']:.2f}",
            "-" if r["steps_per_s"] is None else f"{r['steps_per_s']:.0f}",
            "-" if r["vs_desktop_normal"] is None else f"{r['vs_desktop_normal']:.2f}",
            f"{r['other_load_cores']:.2f}",
        )
    Console().print(t)


if __name__ == "__main__":
    main()
