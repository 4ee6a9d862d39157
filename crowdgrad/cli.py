"""The ``crowdgrad`` command line.

Each subcommand lives in its own module under ``crowdgrad.commands`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a callable
taking the parsed namespace and returning an exit code. Adding a subcommand is
one module plus one entry in ``COMMANDS``. A command may also set ``early``, a
callable run with the namespace before the process-wide set-up (threads, which
imports numba; allocator; collector): the coordinator binds its port there, then
imports what it serves with.

Everything up to the command's ``func``, its imports included, runs with the
cyclic collector paused and with OpenBLAS told the thread count before numpy or
scipy load it (``crowdgrad.process``): so importing this module must not import
numpy.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence

from crowdgrad import __version__

#: Subcommand modules, in the order ``--help`` lists them.
COMMANDS: tuple[str, ...] = (
    "plan",
    "simulate",
    "checkpoint",
    "demo",
    "train",
    "compress",
    "coordinator",
    "client",
)


class UsageError(Exception):
    """A CLI argument or input file is wrong; the message says which and why."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with ``only`` that one subcommand's parser (the
    others' modules, with their imports, are then never loaded)."""
    parser = argparse.ArgumentParser(
        prog="crowdgrad",
        description="Train neural networks on volunteer compute.",
    )
    parser.add_argument("--version", action="version", version=f"crowdgrad {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="compute threads for BLAS and numba (default: $CROWDGRAD_THREADS or 1)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS if only is None else (only,):
        importlib.import_module(f"crowdgrad.commands.{name}").register(sub)
    return parser


def _pre_parser() -> argparse.ArgumentParser:
    """The global options and the subcommand's name, nothing imported."""
    pre = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    pre.add_argument("-v", "--verbose", action="count")
    pre.add_argument("--threads")
    pre.add_argument("--version", action="store_true")
    pre.add_argument("command", nargs="?")
    return pre


def threads_of(argv: Sequence[str] | None) -> int:
    """The compute threads ``argv`` asks for (``--threads``, else
    ``$CROWDGRAD_THREADS``, else 1), read before anything is imported; 1 for a
    value that is not a whole number >= 1 (the parser, or ``set_threads``, says so
    later)."""
    try:
        raw = _pre_parser().parse_known_args(argv)[0].threads
    except argparse.ArgumentError:
        raw = None
    for value in (raw, os.environ.get("CROWDGRAD_THREADS")):
        if value is not None:
            try:
                return max(1, int(value))
            except ValueError:
                return 1
    return 1


@contextlib.contextmanager
def _starting(threads: int) -> Iterator[None]:
    """A start-up's imports: OpenBLAS told ``threads``, the collector paused."""
    from crowdgrad.process import collector_paused, openblas_threads

    with openblas_threads(threads), collector_paused():
        yield


def command_of(argv: Sequence[str] | None) -> str | None:
    """The subcommand ``argv`` names, found without importing any; None when it
    names none or no known one (``--help``, a typo: the whole parser answers).

    Why: every command module imports what it runs (the coordinator's web stack,
    the simulator), together most of a second that ``crowdgrad client`` would
    spend before it starts.
    """
    try:
        known, _ = _pre_parser().parse_known_args(argv)
    except argparse.ArgumentError:  # a malformed global option: the whole parser says so
        return None
    return known.command if known.command in COMMANDS and not known.version else None


def main(argv: Sequence[str] | None = None) -> int:
    threads = threads_of(argv)
    # The start, to the command's own work: imports, the port (``early``), threads,
    # allocator and collector settings. tune_gc freezes what it built before the
    # collector comes back, so no collection walks the imported modules.
    with _starting(threads):
        parser = build_parser(command_of(argv))
        args = parser.parse_args(argv)
        level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)]
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        if not getattr(args, "func", None):
            parser.print_help()
            return 0
        try:
            early = getattr(args, "early", None)
            if early is not None:
                early(args)
            from crowdgrad.process import tune_gc, tune_malloc
            from nn.threads import set_threads

            set_threads(args.threads)
            tune_malloc()
            tune_gc()
        except (UsageError, ValueError, KeyboardInterrupt) as exc:
            return _failed(args, exc)
    try:
        return int(args.func(args) or 0)
    except (UsageError, ValueError, KeyboardInterrupt) as exc:
        return _failed(args, exc)


def _failed(args: argparse.Namespace, exc: BaseException) -> int:
    """The exit code for a usage error (2) or Ctrl-C (130), said on stderr."""
    if isinstance(exc, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        return 130
    print(f"crowdgrad {args.command}: error: {exc}", file=sys.stderr)
    return 2
