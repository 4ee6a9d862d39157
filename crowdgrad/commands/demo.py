"""``crowdgrad demo``: a coordinator plus N local client processes train the digits MLP.

Everything is real: uvicorn on a loopback port, the core on its own thread,
``crowdgrad client`` processes talking msgpack over websockets. It says what it
does in each phase, prints the dashboard and volunteer page URLs, tells joins,
the first accepted result and evaluations as they happen, shows live progress
(accuracy, model version, clients, bytes), and stops at the target accuracy with
a summary and where to go next. On a terminal (stdin and stdout) it then keeps
the coordinator serving, training stopped, so the dashboard and the volunteer
page it printed still show the run, until Ctrl-C; elsewhere (CI, a pipe) it exits
at once. Times count from the command's start, imports included. ``crowdgrad
train`` is the one-machine baseline.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from coordinator.core.config import STRATEGY_NAMES, parse_job
from coordinator.http.console import ConsoleLog
from coordinator.http.server import CrowdServer
from coordinator.http.serving import BackgroundServer
from coordinator.runtime.service import CoreService
from crowdgrad.cli import UsageError
from crowdgrad.commands.coordinator import ConsolePrinter

WIDTHS = (64, 128, 10)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo", help="a coordinator + local clients train digits", description=__doc__
    )
    p.add_argument("--clients", type=int, default=4, help="client processes (default 4)")
    p.add_argument("--strategy", choices=STRATEGY_NAMES, default="decentral-async")
    p.add_argument("--target", type=float, default=0.95, help="target test accuracy")
    p.add_argument("--tau", type=int, default=10, help="local steps per task")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--cpu-share", type=float, default=1.0, help="each client's CPU share")
    p.add_argument("--timeout", type=float, default=300.0, help="give up after (s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--store",
        type=Path,
        help="keep the trained model: write its checkpoints to this new store file "
        "(then: crowdgrad checkpoint export --store FILE --out model.onnx)",
    )
    p.add_argument(
        "--wait",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="after the job, keep the dashboard and volunteer page serving until Ctrl-C "
        "(default: when stdin and stdout are terminals)",
    )
    p.set_defaults(func=run)


def _spawn(url: str, i: int, cpu_share: float, log: IO[bytes]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "crowdgrad", "client", url, "--name", f"demo{i}"]
    cmd += ["--cpu-share", str(cpu_share), "--seed", str(i)]
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    # stderr to a file, not a pipe nobody reads until the end: a chatty client
    # would fill the pipe and block.
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)


def process_age() -> float:
    """Seconds since this process started (Linux: /proc), so the demo's times count
    from the command, imports included; 0.0 where that cannot be read."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def accuracy_text(last_eval: dict[str, float] | None) -> str:
    """The progress line's accuracy: none is not 0.000."""
    if last_eval is None:
        return "no evaluation yet"
    return f"{last_eval['accuracy']:.3f} (v{last_eval['version']})"


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic() - process_age()
    console = Console()

    def since() -> float:
        return time.monotonic() - t0

    if args.clients < 1:
        raise UsageError("--clients must be >= 1")
    if args.store is not None:
        if args.store.exists():
            raise UsageError(
                f"--store: {args.store} exists; the demo starts from scratch, so name a new file"
            )
        if not args.store.parent.is_dir():
            raise UsageError(
                f"--store: directory {args.store.parent} does not exist; create it first"
            )
    job = parse_job(
        {
            "name": "demo",
            "model": {"widths": list(WIDTHS)},
            "data": {"dataset": "digits", "shards": max(8, args.clients), "batch": 16},
            "strategy": {"name": args.strategy, "tau": args.tau, "lr": args.lr},
            "eval": {"every_versions": 5},
            "stop": {"target_accuracy": args.target, "max_time_s": args.timeout},
        },
        source="demo",
    )
    console.print(
        f"[bold]crowdgrad demo[/]: {args.clients} volunteer processes on this machine train an "
        f"MLP {list(WIDTHS)} on scikit-learn's digits ({args.strategy}) until test accuracy "
        f"{args.target}."
    )
    # With a store, acks need not wait for a checkpoint (a demo has nothing to lose):
    # the model is written at the end of the job, where export finds it.
    service = CoreService(
        job, seed=args.seed, store=args.store, ack_durable=False if args.store else None
    )
    crowd = CrowdServer(service)
    printer = ConsolePrinter(console, stamp=lambda: f"      {since():5.1f} s")
    quiet = threading.Event()  # set once the bar is gone: late lines would tear its last line
    timeline = ConsoleLog(lambda text: None if quiet.is_set() else printer(text), burst=4)
    service.add_sink(timeline)
    bg = BackgroundServer(crowd)  # listening now: clients that connect early wait in line
    console.print(
        f"[bold][1/3][/] Serving at {bg.url}. Open these while it runs:\n"
        f"      dashboard:   [bold cyan]{bg.http}/dashboard[/]  (accuracy, clients, events)\n"
        f"      volunteers:  [cyan]{bg.http}/[/]  (a browser tab that clicks Help train joins)"
    )
    console.print(
        f"[bold][2/3][/] Starting {args.clients} client processes: each measures its speed, "
        "joins, fetches its data shard and trains."
    )
    procs: list[subprocess.Popen[bytes]] = []
    reached: bool | None = None
    with tempfile.TemporaryFile() as client_log:
        try:
            procs = [_spawn(bg.url, i, args.cpu_share, client_log) for i in range(args.clients)]
            console.print(
                "[bold][3/3][/] Meanwhile, preparing the coordinator: data shards, model v0 and "
                "the numba kernels (a first run compiles them, about a minute; later runs load "
                "them from the cache)."
            )
            # The core is built here, while the clients start, and before the server
            # runs, so that a first run's compile does not count against the server's
            # start-up timeout; the server then finds the core running.
            service.start()
            console.print(f"      {since():5.1f} s  coordinator ready")
            with bg:
                codes, finished_at = _train(console, args, service, crowd, procs, printer, since)
                quiet.set()
                first = timeline.first_result_at
                reached = _summary(
                    console, args, service, crowd, codes,
                    finished_at=finished_at, first_result=None if first is None else first - t0,
                )  # fmt: skip
                if reached is None:
                    client_log.seek(0)
                    tail = client_log.read().decode(errors="replace")[-2000:]
                    console.print(tail, markup=False, highlight=False)
                elif _wait_wanted(args):
                    _linger(console, bg.http)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            service.stop()
            bg.sock.close()
    return 0 if reached else 1


def _summary(
    console: Console,
    args: argparse.Namespace,
    service: CoreService,
    crowd: CrowdServer,
    codes: list[int | None],
    *,
    finished_at: float,
    first_result: float | None,
) -> bool | None:
    """The closing lines; whether the target was reached (None: the job never ended)."""
    fin, net, st = service.stats.finished, crowd.net, service.stats
    if fin is None:
        console.print("[red]demo: the clients exited before the job finished[/]; their output:")
        return None
    acc = fin["accuracy"]
    reached = fin["reason"] == "target_accuracy"
    how = "reached" if reached else f"stopped ({fin['reason']}) at"
    console.print("[bold]Summary[/]")
    console.print(
        f"  {how} test accuracy {'n/a' if acc is None else f'{acc:.4f}'} (target {args.target}) "
        f"at model v{fin['version']}, {finished_at:.1f} s after the command started"
    )
    first = "none" if first_result is None else f"{first_result:.1f} s"
    console.print(
        f"  first accepted result at {first}; {st.accepted} results accepted and "
        f"{st.rejected} rejected from {args.clients} clients; "
        f"{(net.bytes_in + net.bytes_out) / 1e6:.1f} MB over the wire; clients exited with "
        f"{', '.join(map(str, sorted({c for c in codes if c is not None})))}"
    )
    if args.store is not None:
        console.print(
            f"  the trained model is checkpoint v{fin['version']} in {args.store}: "
            f"crowdgrad checkpoint export --store {args.store} --out model.onnx",
            markup=False,
            highlight=False,
        )
    console.print("[bold]Next[/]")
    for line in NEXT_STEPS:
        console.print(f"  {line}", markup=False, highlight=False)
    return reached


#: Where a newcomer goes after the demo (README and docs hold the details).
NEXT_STEPS = (
    "a real job:    crowdgrad coordinator --host 0.0.0.0   (kept in ./job.crowdgrad.db; "
    'README, "Running a coordinator")',
    "volunteers:    crowdgrad client ws://HOST:8765/ws, or a browser at http://HOST:8765/",
    "the model:     crowdgrad demo --store demo.db, then crowdgrad checkpoint export "
    "--store demo.db --out model.onnx (docs/formats.md)",
    "before renting players: crowdgrad plan --preset large; crowdgrad simulate --list",
    "operating it:  docs/operations.md (dashboard, /metrics, checkpoints)",
)


def _train(
    console: Console,
    args: argparse.Namespace,
    service: CoreService,
    crowd: CrowdServer,
    procs: list[subprocess.Popen[bytes]],
    printer: ConsolePrinter,
    since: Callable[[], float],
) -> tuple[list[int | None], float]:
    """The live progress line until the job finishes or every client has exited;
    then the clients' exit codes and when the job finished (s since the start)."""
    with Progress(
        TextColumn("[bold]accuracy"),
        BarColumn(),
        TextColumn("{task.fields[acc]}  model v{task.fields[version]}"),
        TextColumn("clients {task.fields[clients]}  {task.fields[mb]} MB"),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task = bar.add_task(
            "train", total=args.target, acc=accuracy_text(None), version=0, clients=0, mb=0
        )
        while not service.done.wait(0.2):
            if all(p.poll() is not None for p in procs):
                break
            st, net = service.stats, crowd.net
            bar.update(
                task,
                completed=min(st.last_eval["accuracy"] if st.last_eval else 0.0, args.target),
                acc=accuracy_text(st.last_eval),
                version=st.version,
                clients=len(crowd.peers),
                mb=f"{(net.bytes_in + net.bytes_out) / 1e6:.1f}",
            )
        if st := service.stats.last_eval:
            bar.update(
                task,
                completed=min(st["accuracy"], args.target),
                acc=accuracy_text(st),
                version=service.stats.version,
            )
        finished_at = since()
        codes = _exit_codes(procs)  # their leaves are told while the bar still shows
        printer.flush()
    return codes, finished_at


def _exit_codes(procs: list[subprocess.Popen[bytes]]) -> list[int | None]:
    """Each client's exit code once it has said bye (None: still running after 30 s)."""
    codes: list[int | None] = []
    for p in procs:
        try:
            codes.append(p.wait(30))
        except subprocess.TimeoutExpired:
            codes.append(None)
    return codes


def _wait_wanted(args: argparse.Namespace) -> bool:
    if args.wait is not None:
        return bool(args.wait)
    return sys.stdin.isatty() and sys.stdout.isatty()


def _linger(console: Console, http: str) -> None:
    """Keep serving the finished run for a person to look at, until Ctrl-C (SIGINT).

    The coordinator, its core and the web server run on as they were (the
    server's own thread); only the clients are gone, so the dashboard, the
    volunteer page, /api/status and /api/history show the run as it ended. No time
    limit: the person decides when they have seen enough."""
    console.print(
        "[bold]Training has stopped; the coordinator keeps serving the run[/]:\n"
        f"      dashboard:   [bold cyan]{http}/dashboard[/]\n"
        f"      volunteers:  [cyan]{http}/[/]\n"
        "      Press Ctrl-C to stop."
    )
    forever = threading.Event()
    # Python keeps SIGINT ignored when it started so (a shell that ran us in the
    # background without job control, nohup's subshells): the person was just told
    # to press Ctrl-C, so it must stop the demo whatever was inherited.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            while not forever.wait(3600):
                pass
    finally:
        signal.signal(signal.SIGINT, previous)
    console.print("stopped")
