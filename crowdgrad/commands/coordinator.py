"""``crowdgrad coordinator``: serve a training job to volunteers over websockets.

The job comes from a TOML file (``--job``, see coordinator/config.py) and/or
flags that override it. Prints the URL clients join. SIGINT/SIGTERM stop
accepting, finish the tick, write a checkpoint (with ``--store``) and close
every client with 1001 going away; a restart with the same ``--store`` carries
on from the newest valid checkpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import threading
from typing import Any

from rich.console import Console

from coordinator.config import STRATEGY_NAMES, JobConfig, load_job
from coordinator.data import load_job_data
from coordinator.server import CrowdServer, bind, join_url, make_uvicorn
from coordinator.service import CoreService
from crowdgrad.cli import UsageError
from nn.spec import parse_widths


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("coordinator", help="serve a training job to clients", description=__doc__)
    p.add_argument("--job", help="job file (TOML); flags below override its fields")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0: all)")
    p.add_argument("--port", type=int, default=8765, help="port (0: any free one)")
    p.add_argument("--strategy", choices=STRATEGY_NAMES)
    p.add_argument("--widths", help="model widths, e.g. 64,128,10")
    p.add_argument("--dataset", help="dataset name (nn.data.load_dataset)")
    p.add_argument("--tau", type=int, help="local steps per task (decentral)")
    p.add_argument("--lr", type=float)
    p.add_argument("--batch", type=int)
    p.add_argument("--link", help="link profile: lan, roblox, mobile, unlimited")
    p.add_argument("--target-accuracy", type=float)
    p.add_argument("--max-versions", type=int)
    p.add_argument("--store", help="checkpoint store (SQLite file); restores from it on start")
    p.add_argument("--checkpoint-every", type=int, help="checkpoint every N model versions")
    p.add_argument(
        "--no-ack-durable",
        action="store_true",
        help="ack accepted results before a checkpoint holds them (faster, may lose them)",
    )
    p.add_argument(
        "--durable-interval",
        type=float,
        default=0.5,
        metavar="S",
        help="group-commit window for durable acks in seconds (default 0.5)",
    )
    p.add_argument(
        "--join-token",
        default=os.environ.get("CROWDGRAD_JOIN_TOKEN"),
        help="clients must send this token (env CROWDGRAD_JOIN_TOKEN); open join if unset",
    )
    p.add_argument(
        "--admin-token",
        default=os.environ.get("CROWDGRAD_ADMIN_TOKEN"),
        help="bearer token for /api/admin/* (env CROWDGRAD_ADMIN_TOKEN); disabled if unset",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tick-hz", type=float, default=20.0, help="core tick rate (default 20)")
    p.add_argument(
        "--keep-running", action="store_true", help="keep serving after the job finished"
    )
    p.set_defaults(func=run)


def job_from_args(args: argparse.Namespace) -> JobConfig:
    """The job file (or the default job) with the flags applied on top."""
    job = load_job(args.job) if args.job else JobConfig()
    over: dict[str, dict[str, Any]] = {}

    def put(section: str, key: str, value: Any) -> None:
        if value is not None:
            over.setdefault(section, {})[key] = value

    if args.widths:
        over["model"] = {"widths": list(parse_widths(args.widths)), "preset": None}
    put("data", "dataset", args.dataset)
    put("data", "batch", args.batch)
    put("strategy", "name", args.strategy)
    put("strategy", "tau", args.tau)
    put("strategy", "lr", args.lr)
    put("link", "profile", args.link)
    put("stop", "target_accuracy", args.target_accuracy)
    put("stop", "max_versions", args.max_versions)
    put("checkpoint", "every_versions", args.checkpoint_every)
    return job.replace(**over) if over else job


def public_urls(host: str, port: int) -> list[str]:
    if host not in ("0.0.0.0", "::", ""):
        return [join_url(host, port)]
    urls = [join_url("127.0.0.1", port)]
    try:
        name = socket.gethostname()
        addrs = {a[4][0] for a in socket.getaddrinfo(name, None, socket.AF_INET)}
        urls += [join_url(a, port) for a in sorted(addrs) if not a.startswith("127.")]
    except OSError:
        pass
    return urls


def _ignore(signum: int, frame: object) -> None:
    return None


def run(args: argparse.Namespace) -> int:
    console = Console()
    job = job_from_args(args)
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        raise UsageError(f"--host/--port: cannot bind {args.host}:{args.port}: {exc}") from None
    if args.durable_interval <= 0:
        raise UsageError(f"--durable-interval must be > 0, got {args.durable_interval}")
    try:  # before anything is printed: a bad data file is an error, not a traceback later
        dataset = load_job_data(job)
    except ValueError as exc:
        sock.close()
        raise UsageError(str(exc)) from None
    service = CoreService(
        job,
        seed=args.seed,
        dataset=dataset,
        store=args.store,
        tick_hz=args.tick_hz,
        ack_durable=False if args.no_ack_durable else None,
        durable_interval=args.durable_interval,
    )
    crowd = CrowdServer(service, join_token=args.join_token, admin_token=args.admin_token)
    server = make_uvicorn(crowd)
    port = sock.getsockname()[1]
    console.print(
        f"[bold]crowdgrad coordinator[/]: job {job.name!r}, {job.strategy.name}, model "
        f"{list(job.spec.widths)} on {job.data.source} ({dataset.X_train.shape[0]} training "
        f"rows in {job.data.shards} shards)"
    )
    for url in public_urls(args.host, port):
        console.print(f"  join with:  [bold cyan]crowdgrad client {url}[/]")
    console.print(f"  status:     http://{args.host}:{port}/api/status   docs: /docs")
    if args.join_token:
        console.print("  join token required (--token on the client)")
    if not args.keep_running:

        def exit_when_done() -> None:
            service.done.wait()
            server.should_exit = True

        threading.Thread(target=exit_when_done, daemon=True).start()
    # uvicorn stops gracefully on SIGINT/SIGTERM, then re-raises the signal to the
    # handler it found; a no-op one here makes a graceful stop exit 0.
    previous = {sig: signal.signal(sig, _ignore) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    fin = service.stats.finished
    if fin is not None:
        acc = fin["accuracy"]
        shown = "n/a" if acc is None else f"{acc:.4f}"
        console.print(f"finished: {fin['reason']} at v{fin['version']}, accuracy {shown}")
    else:
        console.print(f"stopped at v{service.stats.version}")
    return 0
