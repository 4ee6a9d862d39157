"""``crowdgrad demo``: train the digits MLP [64, 128, 10] locally and show test accuracy.

For now a local run of the numba core; a later issue turns it into a
coordinator with clients. The loop lives in ``nn``; this command only wires it.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from crowdgrad.commands.train import (
    add_training_arguments,
    optimizer_from_args,
    train_with_progress,
)
from nn.data import load_digits
from nn.spec import ModelSpec

WIDTHS = (64, 128, 10)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train the digits model locally", description=__doc__)
    add_training_arguments(p, steps=1500)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    console = Console()
    optimizer = optimizer_from_args(args)
    ds = load_digits(seed=args.seed)
    spec = ModelSpec(widths=WIDTHS)
    params = spec.init_params(args.seed)
    console.print(
        f"digits: {len(ds.X_train)} train / {len(ds.X_test)} test images, model "
        f"{list(WIDTHS)} ({spec.num_params:,} params), {optimizer.kind} lr {optimizer.lr}"
    )
    result, wall = train_with_progress(
        console, params, optimizer, ds, steps=args.steps, batch=args.batch, seed=args.seed
    )
    console.print(
        f"test accuracy [bold green]{result.accuracy:.4f}[/] (loss {result.loss:.4f}) after "
        f"{args.steps} steps in {wall:.2f} s"
    )
    return 0
