"""``crowdgrad coordinator``: serve a training job to volunteers over websockets.

The job comes from a TOML file (``--job``, see coordinator/core/config.py) and/or
flags that override it. Prints the URL clients join. SIGINT/SIGTERM stop
accepting, finish the tick, write a checkpoint and close every client with 1001
going away, within ``--stop-grace`` (a signal before it serves ends it at once).
The run is kept in ``--store``, by default ``./<job name>.crowdgrad.db``
(``crowdgrad.commands.runstore``; ``--no-store``: nothing is kept); a restart
with the same store carries on from the newest valid checkpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import errno
import importlib
import logging
import os
import platform
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordinator.core.config import STRATEGY_NAMES, JobConfig, load_job

# Light imports only: ``run`` binds the port first and imports the web stack, the
# core and its numba kernels after (see ``run``).
from coordinator.http.admission import AdmissionLimits
from coordinator.http.listen import bind, join_url
from crowdgrad.cli import UsageError
from crowdgrad.commands import runstore
from crowdgrad.stopguard import StopGuard
from nn.spec import parse_widths

if TYPE_CHECKING:
    from rich.console import Console

    from coordinator.federation.edge import EdgeUplink
    from coordinator.http.server import CrowdServer

_ADMISSION = AdmissionLimits()  # the defaults, for the flags' help

#: What ``_serve`` imports: after the bind (``run``).
_SERVING = (
    "rich.console",
    "coordinator.http.console",
    "coordinator.core.data",
    "coordinator.http.server",
    "coordinator.runtime.service",
    "storage.errors",
)


def tau_value(text: str) -> int | str:
    """``--tau``: a positive step count or ``auto``."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("coordinator", help="serve a training job to clients", description=__doc__)
    p.add_argument("--job", help="job file (TOML); flags below override its fields")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0: all)")
    p.add_argument("--port", type=port_number, default=8765, help="port (0: any free one)")
    p.add_argument("--strategy", choices=STRATEGY_NAMES)
    p.add_argument("--widths", help="model widths, e.g. 64,128,10")
    p.add_argument("--dataset", help="dataset name (nn.data.load_dataset)")
    p.add_argument(
        "--tau", type=tau_value, help="local steps per task (decentral), or 'auto' (per client)"
    )
    p.add_argument("--lr", type=float)
    p.add_argument("--batch", type=int)
    p.add_argument("--link", help="link profile: lan, roblox, mobile, unlimited")
    p.add_argument("--target-accuracy", type=float)
    p.add_argument("--max-versions", type=int)
    p.add_argument(
        "--patience",
        type=int,
        help="held-out evaluations without a new best that end the job as converged "
        "(0: never; default: the job's stop.patience, 40)",
    )
    keep = p.add_mutually_exclusive_group()
    keep.add_argument(
        "--store",
        help="checkpoint store (SQLite file); restores from it on start "
        f"(default: ./<job name>{runstore.SUFFIX} in the working directory)",
    )
    keep.add_argument(
        "--no-store",
        action="store_true",
        help="keep nothing: no checkpoints, a crash or Ctrl-C loses the run",
    )
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
    p.add_argument(
        "--stop-grace",
        type=float,
        default=10.0,
        metavar="S",
        help="after SIGTERM/SIGINT or an admin stop the process ends within S seconds, "
        "its final checkpoint written by then or abandoned (default %(default)s)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tick-hz", type=float, default=20.0, help="core tick rate (default 20)")
    p.add_argument(
        "--keep-running", action="store_true", help="keep serving after the job finished"
    )
    p.add_argument(
        "--handshake-timeout",
        type=float,
        default=_ADMISSION.handshake_timeout_s,
        metavar="S",
        help="close a connection that has not made its HTTP/websocket request in S seconds "
        "(default %(default)s)",
    )
    p.add_argument(
        "--max-connections-per-ip",
        type=int,
        default=_ADMISSION.max_connections_per_ip,
        metavar="N",
        help="websocket connections one address may hold (default %(default)s: a school or "
        f"LAN party behind one NAT fits); {_ADMISSION.http_spare_per_ip} more may carry "
        "plain HTTP, so /api/status still answers from an address at its bound",
    )
    p.add_argument(
        "--sessions-per-ip",
        type=float,
        default=_ADMISSION.hellos_per_ip_per_s,
        metavar="R",
        help="websocket sessions one address may open per second, in bursts of "
        f"{_ADMISSION.hello_burst:g} (default %(default)s)",
    )
    p.add_argument(
        "--ssl-certfile",
        metavar="PEM",
        help="serve TLS (wss://, https://) with this certificate chain (needs --ssl-keyfile)",
    )
    p.add_argument("--ssl-keyfile", metavar="PEM", help="the private key of --ssl-certfile")
    p.add_argument(
        "--allow-fresh-start",
        action="store_true",
        help="start from version 0 even when --store holds checkpoints and none verifies "
        "(otherwise that is an error: it would drop every acknowledged result)",
    )
    up = p.add_argument_group(
        "federation", "serve this crowd as an edge of a root coordinator (docs/operations.md)"
    )
    up.add_argument(
        "--upstream",
        metavar="URL",
        help="join the root coordinator at URL (ws://ROOT/ws) and sync this crowd's model with it",
    )
    up.add_argument(
        "--upstream-every-versions",
        type=int,
        default=50,
        metavar="H",
        help="sync after this many of this edge's model versions (default %(default)s)",
    )
    up.add_argument(
        "--upstream-every-s",
        type=float,
        default=30.0,
        metavar="T",
        help="or after this many seconds, whichever comes first (default %(default)s)",
    )
    up.add_argument(
        "--upstream-token",
        default=os.environ.get("CROWDGRAD_UPSTREAM_TOKEN"),
        help="the root's join token (env CROWDGRAD_UPSTREAM_TOKEN)",
    )
    up.add_argument("--upstream-ca", metavar="PEM", help="for a wss:// root: trust these CAs")
    p.set_defaults(func=run, early=listen_early)


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0 to 65535 (0: any free one)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(
            f"must be a whole number from 0 to 65535 (0: any free one), got {text!r}"
        )
    return port


def check_tokens(args: argparse.Namespace) -> None:
    """Refuse a token that is surely a mistake: blank (an empty one means none), or
    an admin token with whitespace around it (no bearer header can carry it)."""
    for flag, env, token in (
        ("--admin-token", "CROWDGRAD_ADMIN_TOKEN", args.admin_token),
        ("--join-token", "CROWDGRAD_JOIN_TOKEN", args.join_token),
    ):
        if not token:
            continue
        if not token.strip():
            raise UsageError(
                f"{flag} (or {env}) is blank: give a token, or leave it unset (or empty) for none"
            )
        if flag == "--admin-token" and token != token.strip():
            raise UsageError(
                f"{flag} (or {env}): the token begins or ends with whitespace, which "
                "the Authorization header cannot carry"
            )


def check_store_path(store: str) -> None:
    """Refuse a --store the coordinator could not write, before anything is served:
    SQLite opens a read-only file without complaint and fails at the first
    checkpoint, and it keeps its -wal and -shm files beside the store."""
    path = Path(store)
    parent = path.parent
    if path.is_dir():
        raise UsageError(
            f"--store: {path} is a directory; give a file name, e.g. {path / 'run.db'}"
        )
    if not parent.is_dir():
        raise UsageError(
            f"--store: directory {parent} does not exist; create it first (mkdir -p {parent})"
        )
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        raise UsageError(
            f"--store: {path} is not writable, and the coordinator writes its checkpoints "
            "there; read it with 'crowdgrad checkpoint', or copy it somewhere writable"
        )
    if not os.access(parent, os.W_OK):
        raise UsageError(
            f"--store: directory {parent} is not writable (read-only, or not yours); the "
            "store and SQLite's -wal and -shm files beside it must be"
        )


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
    put("stop", "patience", args.patience)
    put("checkpoint", "every_versions", args.checkpoint_every)
    return job.replace(**over) if over else job


def public_urls(host: str, port: int, *, tls: bool = False) -> list[str]:
    if host not in ("0.0.0.0", "::", ""):
        return [join_url(host, port, tls=tls)]
    urls = [join_url("127.0.0.1", port, tls=tls)]
    try:
        name = socket.gethostname()
        addrs = {a[4][0] for a in socket.getaddrinfo(name, None, socket.AF_INET)}
        urls += [join_url(a, port, tls=tls) for a in sorted(addrs) if not a.startswith("127.")]
    except OSError:
        pass
    return urls


class ConsolePrinter:
    """``emit`` for ConsoleLog: hands each line to a writer thread and returns at once.

    ConsoleLog runs on the core thread; a stdout that blocks (a full pipe nobody
    reads, a paused pager) must never stall training, so lines wait in a bounded
    queue and, past ``queue_lines``, are dropped and counted instead.
    """

    def __init__(
        self,
        console: Console,
        *,
        stamp: Callable[[], str] | None = None,
        queue_lines: int = 1000,
    ) -> None:
        self.console = console
        self.stamp = stamp or (lambda: f"{dt.datetime.now():%H:%M:%S}")
        self.dropped = 0
        self._lines: queue.Queue[str] = queue.Queue(maxsize=queue_lines)
        threading.Thread(target=self._write, name="crowdgrad-console", daemon=True).start()

    def _write(self) -> None:
        while True:
            text = self._lines.get()
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)
            self._lines.task_done()

    def __call__(self, text: str) -> None:
        try:
            if self.dropped:
                note = f"({self.dropped} console lines dropped: the output was blocked)"
                self._lines.put_nowait(f"{self.stamp()}  {note}")
                self.dropped = 0
            self._lines.put_nowait(f"{self.stamp()}  {text}")
        except queue.Full:
            self.dropped += 1

    def flush(self, timeout: float = 5.0) -> None:
        """Wait (at most ``timeout``) until every queued line is written."""
        deadline = time.monotonic() + timeout
        while self._lines.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)


def stop_guard(args: argparse.Namespace) -> StopGuard:
    """The command's guard, installed on first use (``listen_early``, else ``run``)."""
    guard: StopGuard | None = getattr(args, "stop_guard", None)
    if guard is None:
        guard = args.stop_guard = StopGuard(args.stop_grace)
        guard.install()
    return guard


async def serve_with_uplink(
    server: Any, crowd: CrowdServer, sock: socket.socket, uplink: EdgeUplink | None
) -> None:
    """uvicorn, and beside it on the same loop the edge's client of its root."""
    if uplink is None:
        await server.serve(sockets=[sock])
        return
    from coordinator.federation.edge import attach_upstream

    async def up() -> None:
        while not server.started:  # the lifespan starts the core thread
            await asyncio.sleep(0.05)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: crowd.service.call(attach_upstream).result())
        code = await uplink.run()
        if code:
            logging.getLogger("crowdgrad.edge").error(
                "the root refused this edge or could not be reached (exit %d); "
                "the edge keeps serving its own crowd",
                code,
            )

    task = asyncio.ensure_future(up())
    try:
        await server.serve(sockets=[sock])
    finally:
        uplink.request_stop()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(task, 10.0)


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, or a UsageError that says why not."""
    try:
        return bind(host, port)
    except (OSError, OverflowError) as exc:
        hint = ""
        if getattr(exc, "errno", None) == errno.EADDRINUSE:
            hint = " (is another coordinator running? choose another --port, or 0 for any free one)"
        raise UsageError(f"--host/--port: cannot bind {host}:{port}: {exc}{hint}") from None


def listen_early(args: argparse.Namespace) -> None:
    """The CLI's ``early`` hook: bind before anything heavy is imported (``run``),
    then import what serving needs (the CLI's start-up, with the collector paused).
    Signals are caught from here on (``StopGuard``)."""
    if not args.stop_grace > 0:
        raise UsageError(f"--stop-grace must be > 0, got {args.stop_grace}")
    check_tokens(args)
    guard = stop_guard(args)
    try:
        args.listening = listen(args.host, args.port)
        for name in _SERVING:
            importlib.import_module(name)
    except BaseException:  # ``run`` will not come to restore them
        guard.restore()
        raise


def run(args: argparse.Namespace) -> int:
    """Bind (the CLI did already: ``listen_early``), then import what serving needs,
    then serve.

    Why bind first: numba, the web stack and the core take most of a second of
    CPU to import (several seconds when volunteers start on the same cores), and
    a client that connects meanwhile waits in the listen backlog, answered as soon
    as the server runs, instead of being refused and sleeping its backoff out.
    """
    check_tokens(args)
    guard = stop_guard(args)
    try:
        sock = getattr(args, "listening", None) or listen(args.host, args.port)
        # the socket closed on every error below (and again, harmlessly, after
        # serving); ``held`` releases the store's lock
        with sock, contextlib.ExitStack() as held:
            return _serve(args, job_from_args(args), sock, guard, held)
    finally:
        guard.restore()


def _serve(
    args: argparse.Namespace,
    job: JobConfig,
    sock: socket.socket,
    guard: StopGuard,
    held: contextlib.ExitStack,
) -> int:
    from rich.console import Console
    from rich.markup import escape

    from coordinator.core.data import load_job_data
    from coordinator.http.console import ConsoleLog
    from coordinator.http.server import CrowdServer
    from coordinator.http.serving import make_uvicorn
    from coordinator.runtime.service import CoreService
    from coordinator.runtime.stores import FreshStartRefused
    from storage.errors import StorageError

    console = Console()
    if args.durable_interval <= 0:
        raise UsageError(f"--durable-interval must be > 0, got {args.durable_interval}")
    store, default_store = runstore.chosen_store(args, job)
    if store is not None:
        check_store_path(str(store))
    try:  # before anything is printed: a bad data file is an error, not a traceback later
        dataset = load_job_data(job)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    service = CoreService(
        job,
        seed=args.seed,
        dataset=dataset,
        store=store,
        tick_hz=args.tick_hz,
        ack_durable=False if args.no_ack_durable else None,
        durable_interval=args.durable_interval,
        allow_fresh_start=args.allow_fresh_start,
    )
    try:
        admission = AdmissionLimits(
            handshake_timeout_s=args.handshake_timeout,
            max_connections_per_ip=args.max_connections_per_ip,
            hellos_per_ip_per_s=args.sessions_per_ip,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    crowd = CrowdServer(
        service, join_token=args.join_token, admin_token=args.admin_token, admission=admission
    )
    tls = args.ssl_certfile is not None
    try:
        if (args.ssl_certfile is None) != (args.ssl_keyfile is None):
            raise ValueError("give both --ssl-certfile and --ssl-keyfile, or neither")
        for path in (args.ssl_certfile, args.ssl_keyfile):
            if path is not None and not os.path.isfile(path):
                raise ValueError(f"{path}: no such file")
        server = make_uvicorn(crowd, ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile)
        if tls:
            server.config.load()  # a bad certificate or key is an error now, not later
    except (ValueError, OSError) as exc:
        raise UsageError(f"--ssl-certfile/--ssl-keyfile: {exc}") from None
    port = sock.getsockname()[1]
    uplink = None
    if args.upstream is not None:
        from coordinator.federation.edge import EdgeUplink

        try:
            uplink = EdgeUplink(
                args.upstream,
                service,
                every_versions=args.upstream_every_versions,
                every_s=args.upstream_every_s,
                name=f"edge-{platform.node()[:32]}-{port}",
                token=args.upstream_token,
                ca=args.upstream_ca,
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if store is not None:  # every refusal above came before the store was touched
        lock = runstore.StoreLock(store)
        lock.acquire()
        held.callback(lock.release)
        runstore.check_same_model(store, job, default=default_store)
    try:
        service.prepare()
    except (FreshStartRefused, StorageError) as exc:
        raise UsageError(f"--store: {exc}") from None
    say = ConsolePrinter(console)
    console_log = ConsoleLog(say)
    service.add_sink(console_log)
    console.print(
        f"[bold]crowdgrad coordinator[/]: job {job.name!r}, {job.strategy.name}, model "
        f"{list(job.spec.widths)} on {job.data.source} ({dataset.X_train.shape[0]} training "
        f"rows in {job.data.shards} shards)"
    )
    for url in public_urls(args.host, port, tls=tls):
        console.print(f"  join with:  [bold cyan]crowdgrad client {url}[/]")
    # the page URLs, as join_url shows the websocket one
    http = join_url(args.host, port, tls=tls).replace("ws", "http", 1).removesuffix("/ws")
    console.print(f"  dashboard:  [bold cyan]{http}/dashboard[/]")
    console.print(f"  volunteers: {http}/  (a browser joins from this page)")
    console.print(f"  status:     {http}/api/status  {http}/metrics  {http}/docs", soft_wrap=True)
    if store is not None:
        where = escape(runstore.describe(store, default=default_store))
        resumed = service.resume_version
        if resumed is None:
            console.print(
                f"  store:      {where}: no checkpoint yet, starting from model v0",
                highlight=False, soft_wrap=True,
            )  # fmt: skip
        else:
            console.print(
                f"  store:      {where}: [bold]resumed from checkpoint {resumed}[/] "
                f"(model v{resumed})", highlight=False, soft_wrap=True,
            )  # fmt: skip
    else:
        console.print("  store:      none (--no-store): nothing is kept when this stops")
    if args.join_token:
        console.print("  join token required (--token on the client)")
    if uplink is not None:
        console.print(
            f"  upstream:   {args.upstream} (an edge: syncs every "
            f"{args.upstream_every_versions} versions or {args.upstream_every_s:g} s)"
        )
    if not args.keep_running:

        def exit_when_done() -> None:
            service.done.wait()
            server.should_exit = True

        threading.Thread(target=exit_when_done, daemon=True).start()
    # uvicorn stops gracefully on SIGINT/SIGTERM, then re-raises the signal to the
    # handler it found: the guard's, which only notes it, so a graceful stop exits 0.
    guard.attach(server)
    if guard.requested is not None:  # before serving: the store is as it was
        console.print(f"stopped before serving ({signal.Signals(guard.requested).name})")
        return 0
    asyncio.run(serve_with_uplink(server, crowd, sock, uplink))
    console_log.flush()
    say.flush()
    fin = service.stats.finished
    if fin is not None:
        acc = fin["accuracy"]
        shown = "n/a" if acc is None else f"{acc:.4f}"
        console.print(f"finished: {fin['reason']} at v{fin['version']}, accuracy {shown}")
    else:
        console.print(f"stopped at v{service.stats.version}")
    return 0
