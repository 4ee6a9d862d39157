"""``crowdgrad demo``: a coordinator plus N local client processes train the digits MLP.

Everything is real: uvicorn on a loopback port, the core on its own thread,
``crowdgrad client`` processes talking msgpack over websockets. Live progress
shows accuracy, model version, clients and bytes; the run stops at the target
accuracy with a summary. ``crowdgrad train`` is the one-machine baseline.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from coordinator.config import STRATEGY_NAMES, parse_job
from coordinator.server import BackgroundServer, CrowdServer
from coordinator.service import CoreService

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
    p.set_defaults(func=run)


def _spawn(url: str, i: int, cpu_share: float) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "client.desktop", url, "--name", f"demo{i}"]
    cmd += ["--cpu-share", str(cpu_share), "--seed", str(i)]
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def run(args: argparse.Namespace) -> int:
    console = Console()
    if args.clients < 1:
        console.print("demo: --clients must be >= 1")
        return 2
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
    service = CoreService(job, seed=args.seed)
    crowd = CrowdServer(service)
    t0 = time.perf_counter()
    with BackgroundServer(crowd) as bg:
        console.print(
            f"coordinator at [bold cyan]{bg.url}[/] ({bg.http}/api/status); "
            f"{args.clients} clients, {args.strategy}, model {list(WIDTHS)} on digits"
        )
        procs = [_spawn(bg.url, i, args.cpu_share) for i in range(args.clients)]
        try:
            with Progress(
                TextColumn("[bold]accuracy"),
                BarColumn(),
                TextColumn("{task.fields[acc]}  v{task.fields[version]}"),
                TextColumn("clients {task.fields[clients]}  {task.fields[mb]} MB"),
                TimeElapsedColumn(),
                console=console,
            ) as bar:
                task = bar.add_task("train", total=args.target, acc="-", version=0, clients=0, mb=0)
                while not service.done.wait(0.2):
                    if all(p.poll() is not None for p in procs):
                        break
                    st, net = service.stats, crowd.net
                    acc = st.last_eval["accuracy"] if st.last_eval else 0.0
                    bar.update(
                        task,
                        completed=min(acc, args.target),
                        acc=f"{acc:.3f}",
                        version=st.version,
                        clients=len(crowd.peers),
                        mb=f"{(net.bytes_in + net.bytes_out) / 1e6:.1f}",
                    )
                if st := service.stats.last_eval:
                    bar.update(task, completed=min(st["accuracy"], args.target))
            codes = [p.wait(30) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    wall = time.perf_counter() - t0
    fin, net = service.stats.finished, crowd.net
    if fin is None:
        console.print("[red]demo: the clients exited before the job finished[/]")
        for p in procs:
            if p.stderr is not None:
                console.print(p.stderr.read().decode(errors="replace")[-2000:])
        return 1
    acc = fin["accuracy"] or 0.0
    console.print(
        f"[bold green]{fin['reason']}[/]: test accuracy {acc:.4f} at model v{fin['version']} "
        f"in {wall:.1f} s; {service.stats.accepted} results from {args.clients} clients, "
        f"{(net.bytes_in + net.bytes_out) / 1e6:.1f} MB over the wire; "
        f"clients exited {sorted(set(codes))}"
    )
    return 0 if fin["reason"] == "target_accuracy" else 1
