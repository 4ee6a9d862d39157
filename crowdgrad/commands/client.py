"""``crowdgrad client URL``: lend this machine's CPU to a coordinator.

Measures this machine's FLOP/s, joins, computes tasks on a worker thread at
idle priority (``--priority``; ``--cpu-share`` duty-cycles it too), reconnects
with backoff and resumes its session. Ctrl-C finishes (or abandons) the task in
hand, says bye and exits 0.

It says when it joined (the job, its client id, the model, its link, CPU share
and priority), what it does (a progress line: updated in place on a terminal, a
plain line every 30 s elsewhere), why it cannot connect, and why it left with
its totals. ``--quiet``: only what went wrong. Exit codes: 0 the job finished or
the client was stopped, 1 gave up (``--max-attempts``), 2 refused (join token,
protocol version, TLS certificate, an HTTP error, a bad argument).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from typing import IO, TYPE_CHECKING, Any

from client.desktop import DesktopClient
from client.priority import Priority
from client.report import Reporter
from crowdgrad.cli import UsageError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.live import Live


class PlainConsole:
    """What ConsoleReporter prints with, off a terminal: each text and a newline,
    flushed, as rich's Console prints plain text there (markup off, soft wrap).

    Why: importing rich costs each client start ~15 ms of CPU for output that is
    plain lines anyway (a log file, a service's journal, a benchmark's pipe)."""

    is_terminal = False

    def __init__(self, *, stderr: bool = False) -> None:
        self.stderr = stderr

    @property
    def file(self) -> IO[str]:
        """sys.stdout or sys.stderr as it is now (rich's Console looks it up too)."""
        return sys.stderr if self.stderr else sys.stdout

    def print(self, text: str, **_: Any) -> None:
        file = self.file
        file.write(f"{text}\n")
        file.flush()


def default_console(*, stderr: bool = False) -> Console | PlainConsole:
    """rich's Console where it could draw the live line: a terminal, or an
    environment that says to treat the stream as one (rich reads
    ``TTY_COMPATIBLE`` and ``FORCE_COLOR``); a PlainConsole elsewhere."""
    try:
        tty = (sys.stderr if stderr else sys.stdout).isatty()
    except (AttributeError, ValueError):
        tty = False
    if tty or "TTY_COMPATIBLE" in os.environ or "FORCE_COLOR" in os.environ:
        from rich.console import Console

        return Console(stderr=stderr, highlight=False)
    return PlainConsole(stderr=stderr)


class ConsoleReporter:
    """The client's sentences on the console (client.report.Reporter): sentences
    and the summary on stdout, problems on stderr; the progress line live on a
    terminal, else a plain line with the time every ``interval`` seconds."""

    def __init__(
        self,
        *,
        quiet: bool = False,
        interval: float | None = None,
        out: Console | PlainConsole | None = None,
        err: Console | PlainConsole | None = None,
    ) -> None:
        self.out = out if out is not None else default_console()
        self.err = err if err is not None else default_console(stderr=True)
        self.quiet = quiet
        self.live = self.out.is_terminal
        default = 1.0 if self.live else 30.0
        self.progress_interval = 0.0 if quiet else (default if interval is None else interval)
        self._live: Live | None = None

    def _stamp(self, text: str) -> str:
        return text if self.live else f"{time.strftime('%H:%M:%S')} {text}"

    def say(self, text: str) -> None:
        if not self.quiet:
            self.out.print(self._stamp(text), markup=False, soft_wrap=True)

    def problem(self, text: str) -> None:
        self.err.print(self._stamp(text), markup=False, soft_wrap=True)

    def progress(self, text: str) -> None:
        if self.quiet:
            return
        if not self.live:
            self.out.print(self._stamp(text), markup=False, soft_wrap=True)
            return
        from rich.text import Text  # a terminal only: self.out is rich's Console

        if self._live is None:
            from rich.live import Live

            self._live = Live(console=self.out, auto_refresh=False, transient=True)
            self._live.start()
        line = Text(text, style="bold", no_wrap=True, overflow="ellipsis")
        self._live.update(line, refresh=True)

    def close(self) -> None:
        """Take the live line off the screen (the summary says the totals)."""
        if self._live is not None:
            self._live.stop()
            self._live = None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="the coordinator's websocket URL (ws://host:port/ws)")
    p.add_argument(
        "--name", help="shown on the coordinator and beside your credit (default: host-pid)"
    )
    p.add_argument(
        "--anonymous",
        dest="volunteer",
        action="store_false",
        help="send no volunteer key: no credit, no link between your runs (default: the "
        "key kept in the cache folder)",
    )
    p.add_argument("--token", default=os.environ.get("CROWDGRAD_JOIN_TOKEN"), help="join token")
    p.add_argument(
        "--cpu-share",
        type=float,
        default=1.0,
        help="fraction of one core to use, in (0, 1] (default 1: as fast as possible)",
    )
    p.add_argument(
        "--priority",
        choices=[p.value for p in Priority],
        default=Priority.IDLE.value,
        help="of the compute threads: idle (default: SCHED_IDLE on Linux, the lowest "
        "class elsewhere; only CPU nothing else wants) or normal",
    )
    p.add_argument(
        "--flops",
        type=float,
        help="report this training FLOP/s instead of the start-up measurement (kept "
        "in the cache folder for a day)",
    )
    p.add_argument(
        "--max-mb-per-hour",
        type=float,
        metavar="MB",
        help="your data cap: at most this many megabytes an hour, down and up together "
        "(the coordinator then sends longer tasks and, where its job allows, int8; "
        "default: no cap of your own)",
    )
    p.add_argument("--seed", type=int, help="seeds update codecs and jitter (default: pid)")
    p.add_argument("--max-attempts", type=int, help="give up after this many failed connects")
    p.add_argument("--stop-grace", type=float, default=3.0, help="seconds to finish a task")
    p.add_argument(
        "--no-seeded-init",
        dest="seeded_init",
        action="store_false",
        help="download version 0 instead of building it from the job's init seed "
        "(announces no init scheme, docs/protocol.md §12.3)",
    )
    p.add_argument(
        "--no-prefetch",
        dest="prefetch",
        action="store_false",
        help="wait for each task instead of fetching the next one while computing",
    )
    p.add_argument(
        "--cache-dir",
        help="where fetched data shards are kept, one file per sha256, and the FLOP/s "
        "measurement (default: $CROWDGRAD_CACHE_DIR, else $XDG_CACHE_HOME/crowdgrad/data, "
        "else ~/.cache/crowdgrad/data)",
    )
    p.add_argument(
        "--no-cache",
        dest="cache",
        action="store_false",
        help="keep fetched shards in memory only (fetch them again next run) and "
        "measure FLOP/s at every start",
    )
    p.add_argument(
        "--ca",
        metavar="PEM",
        help="for wss:// URLs: trust these CA certificates (e.g. a self-signed "
        "coordinator's) instead of the system's",
    )
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="say only what went wrong (no join, progress or summary lines)",
    )
    p.add_argument(
        "--progress-interval",
        type=float,
        metavar="SECONDS",
        help="seconds between progress lines (default: 1 on a terminal, where the line "
        "updates in place, else 30; 0: none)",
    )
    p.add_argument(
        "--no-data-fetch",
        dest="fetch_data",
        action="store_false",
        help="load the job's built-in dataset on this machine instead of fetching shards "
        "(refused by jobs whose data is a file)",
    )


#: The option each DesktopClient argument comes from, to name it in an error.
OPTION_OF = {
    "cpu_share": "--cpu-share",
    "priority": "--priority",
    "ca": "--ca",
    "name": "--name",
    "max_mb_per_hour": "--max-mb-per-hour",
}


def client_from_args(args: argparse.Namespace, reporter: Reporter | None = None) -> DesktopClient:
    """The client ``args`` describe; a bad value raises UsageError naming its option."""
    try:
        return _client(args, reporter)
    except ValueError as exc:
        name, sep, rest = str(exc).partition(":")
        word = name.split()[0] if name else ""
        if sep and word in OPTION_OF:
            raise UsageError(f"{OPTION_OF[word]}{name[len(word) :]}:{rest}") from None
        raise


def _client(args: argparse.Namespace, reporter: Reporter | None) -> DesktopClient:
    return DesktopClient(
        args.url,
        name=args.name,
        token=args.token,
        cpu_share=args.cpu_share,
        flops=args.flops,
        seed=args.seed,
        max_attempts=args.max_attempts,
        stop_grace=args.stop_grace,
        seeded_init=args.seeded_init,
        prefetch=args.prefetch,
        cache_dir=args.cache_dir,
        cache=args.cache,
        fetch_data=args.fetch_data,
        ca=args.ca,
        priority=args.priority,
        lower_pools=True,
        reporter=reporter,
        volunteer=args.volunteer,
        max_mb_per_hour=args.max_mb_per_hour,
    )


async def run_until_signal(client: DesktopClient) -> int:
    """Run ``client`` with SIGINT/SIGTERM wired to a graceful stop."""
    loop = asyncio.get_running_loop()
    for sig, why in ((signal.SIGINT, "stopped (Ctrl-C)"), (signal.SIGTERM, "stopped (SIGTERM)")):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, client.request_stop, why)
    return await client.run()


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("client", help="join a coordinator as a volunteer", description=__doc__)
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    reporter = ConsoleReporter(quiet=args.quiet, interval=args.progress_interval)
    client = client_from_args(args, reporter=reporter)
    try:
        return asyncio.run(run_until_signal(client))
    finally:
        reporter.close()
