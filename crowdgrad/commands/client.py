"""``crowdgrad client URL``: lend this machine's CPU to a coordinator.

Measures this machine's FLOP/s, joins, computes tasks on a worker thread at
idle priority (``--priority``; ``--cpu-share`` duty-cycles it too), reconnects
with backoff and resumes its session. Ctrl-C finishes (or abandons) the task in
hand, says bye and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio

from client.desktop import add_arguments, client_from_args, run_until_signal


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("client", help="join a coordinator as a volunteer", description=__doc__)
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return asyncio.run(run_until_signal(client_from_args(args)))
