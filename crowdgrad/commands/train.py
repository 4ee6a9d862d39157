"""``crowdgrad train``: train a model on one machine with the numba core.

The local baseline every distributed run is compared with (the seed's "linear,
one machine" row), and a quick way to check that a model and dataset fit.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from crowdgrad.cli import UsageError
from nn.data import Dataset, load_dataset
from nn.optim import OPT_CODES, Optimizer, OptState
from nn.params import Params
from nn.spec import PRESETS, ModelSpec, parse_widths
from nn.train import EvalResult, evaluate, fit


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model locally (no coordinator)", description=__doc__)
    add_training_arguments(p)
    p.add_argument("--preset", choices=sorted(PRESETS), help="model preset (mse, seed widths)")
    p.add_argument("--widths", help="model widths, e.g. 64,128,10 (instead of --preset)")
    p.add_argument(
        "--dataset", default="digits", help="'digits' or 'teacher:<preset>' (default digits)"
    )
    p.add_argument("--save", help="write the trained model to this .npz file")
    p.set_defaults(func=run)


def add_training_arguments(p: argparse.ArgumentParser, *, steps: int = 1000) -> None:
    p.add_argument("--steps", type=int, default=steps, help=f"optimizer steps (default {steps})")
    p.add_argument("--batch", type=int, default=32, help="mini-batch size (default 32)")
    p.add_argument("--lr", type=float, default=0.2, help="learning rate (default 0.2)")
    p.add_argument("--optimizer", choices=OPT_CODES, default="sgd")
    p.add_argument("--momentum", type=float, default=0.9, help="momentum (default 0.9)")
    p.add_argument("--nesterov", action="store_true", help="Nesterov momentum")
    p.add_argument("--seed", type=int, default=0, help="seed for init, split and batches")


def optimizer_from_args(args: argparse.Namespace) -> Optimizer:
    if args.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    if args.batch < 1:
        raise UsageError(f"--batch must be >= 1, got {args.batch}")
    return Optimizer(
        kind=args.optimizer, lr=args.lr, momentum=args.momentum, nesterov=args.nesterov
    )


def spec_for(args: argparse.Namespace, ds: Dataset) -> ModelSpec:
    """The model from --preset/--widths, checked against the dataset's shapes."""
    if (args.preset is None) == (args.widths is None):
        raise UsageError("give exactly one of --preset or --widths")
    loss = "softmax_ce" if ds.num_classes is not None else "mse"
    widths = PRESETS[args.preset] if args.preset else parse_widths(args.widths)
    spec = ModelSpec(widths=widths, loss=loss)
    outputs = ds.num_classes if ds.num_classes is not None else ds.y_train.shape[1]
    if spec.widths[0] != ds.num_features or spec.widths[-1] != outputs:
        raise UsageError(
            f"model widths {list(spec.widths)} do not fit dataset {ds.name!r}: it has "
            f"{ds.num_features} inputs and {outputs} outputs"
        )
    return spec


def train_with_progress(
    console: Console,
    params: Params,
    optimizer: Optimizer,
    ds: Dataset,
    *,
    steps: int,
    batch: int,
    seed: int,
) -> tuple[EvalResult, float]:
    """Train with a rich progress bar; returns the test result and wall seconds."""
    state = OptState.init(optimizer, params.spec)
    rng = np.random.default_rng(seed)
    with Progress(
        TextColumn("[bold]training"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} steps"),
        TextColumn("loss {task.fields[loss]:.4f}"),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task = bar.add_task("train", total=steps, loss=float("nan"))
        t0 = time.perf_counter()
        fit(
            params, state, ds.X_train, ds.y_train, steps, batch, rng,
            chunk=max(1, steps // 50),
            on_chunk=lambda done, m: bar.update(task, completed=done, loss=m.loss),
        )  # fmt: skip
        wall = time.perf_counter() - t0
    return evaluate(params, ds.X_test, ds.y_test), wall


def run(args: argparse.Namespace) -> int:
    console = Console()
    optimizer = optimizer_from_args(args)
    ds = load_dataset(args.dataset, seed=args.seed)
    spec = spec_for(args, ds)
    params = spec.init_params(args.seed)
    console.print(
        f"model {list(spec.widths)} ({spec.num_params:,} params, {spec.loss}), dataset "
        f"{ds.name} ({len(ds.X_train)} train / {len(ds.X_test)} test), {optimizer.kind} "
        f"lr {optimizer.lr}, batch {args.batch}"
    )
    result, wall = train_with_progress(
        console, params, optimizer, ds, steps=args.steps, batch=args.batch, seed=args.seed
    )
    console.print(
        f"test loss {result.loss:.4f}, test accuracy [bold]{result.accuracy:.4f}[/bold] "
        f"({args.steps / wall:,.0f} steps/s)"
    )
    if args.save:
        from nn.modelfile import save_model

        save_model(args.save, params, metadata={"dataset": ds.name, "test": result.accuracy})
        console.print(f"saved {args.save}")
    return 0
