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
import os
import sys
import time
from typing import IO, TYPE_CHECKING, Any

from client.desktop import add_arguments, client_from_args, run_until_signal

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
