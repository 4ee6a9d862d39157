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
import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from client.desktop import add_arguments, client_from_args, run_until_signal

if TYPE_CHECKING:
    from rich.live import Live


class ConsoleReporter:
    """The client's sentences on the console (client.report.Reporter): sentences
    and the summary on stdout, problems on stderr; the progress line live on a
    terminal, else a plain line with the time every ``interval`` seconds."""

    def __init__(
        self,
        *,
        quiet: bool = False,
        interval: float | None = None,
        out: Console | None = None,
        err: Console | None = None,
    ) -> None:
        self.out = out if out is not None else Console(highlight=False)
        self.err = err if err is not None else Console(stderr=True, highlight=False)
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
        if self._live is None:
            from rich.live import Live  # a terminal only

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
