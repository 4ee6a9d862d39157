"""The ``crowdgrad`` command line.

Each subcommand lives in its own module under ``crowdgrad.commands`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a callable
taking the parsed namespace and returning an exit code. Adding a subcommand is
one module plus one entry in ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

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


def command_of(argv: Sequence[str] | None) -> str | None:
    """The subcommand ``argv`` names, found without importing any; None when it
    names none or no known one (``--help``, a typo: the whole parser answers).

    Why: every command module imports what it runs (the coordinator's web stack,
    the simulator), together most of a second that ``crowdgrad client`` would
    spend before it starts.
    """
    pre = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    pre.add_argument("-v", "--verbose", action="count")
    pre.add_argument("--threads")
    pre.add_argument("--version", action="store_true")
    pre.add_argument("command", nargs="?")
    try:
        known, _ = pre.parse_known_args(argv)
    except argparse.ArgumentError:  # a malformed global option: the whole parser says so
        return None
    return known.command if known.command in COMMANDS and not known.version else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(command_of(argv))
    args = parser.parse_args(argv)
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        from crowdgrad.process import tune_gc, tune_malloc
        from nn.threads import set_threads

        set_threads(args.threads)
        tune_malloc()
        tune_gc()
        return int(args.func(args) or 0)
    except (UsageError, ValueError) as exc:
        print(f"crowdgrad {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
