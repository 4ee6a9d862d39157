"""``crowdgrad train``: train a model on one machine with the numba core.

The local baseline every distributed run is compared with (the seed's "linear,
one machine" row), and a quick way to check that a model and dataset fit.
With ``--job`` it is the anchor of that job (crowdgrad/anchor.py): the job's
data, model, batch and held-out rows for ``--seconds`` of training, the
fastest thread count, and with ``--grid`` the best optimizer and lr of a short
trial of each; ``--json`` records its accuracy over time.
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
    p.add_argument("--job", help="train this job file's model on its data: its one-machine anchor")
    p.add_argument(
        "--seconds", type=float, default=60.0, help="--job: training seconds (default 60)"
    )
    p.add_argument(
        "--grid", action="store_true", help="--job: try SGD, momentum and Adam lrs first"
    )
    p.add_argument(
        "--grid-seconds", type=float, help="--job --grid: seconds a trial (default seconds/4)"
    )
    p.add_argument(
        "--eval-every", type=float, default=0.5, help="--job: seconds between evaluations"
    )
    p.add_argument("--json", help="--job: write the anchor's history to this file ('-': stdout)")
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
    if args.job is not None:
        return run_job(args)
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


def run_job(args: argparse.Namespace) -> int:
    """The job's one-machine anchor, printed as it trains and kept with ``--json``."""
    import json

    from coordinator.core.config import JobConfigError, load_job
    from crowdgrad.anchor import AnchorRun, Point, anchor_of

    if args.preset or args.widths or args.dataset != "digits":
        raise UsageError("--job takes the model and data from the job file: drop --preset, "
                         "--widths and --dataset")  # fmt: skip
    for name in ("seconds", "eval_every"):
        if not getattr(args, name) > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.grid_seconds is not None and not args.grid_seconds > 0:
        raise UsageError(f"--grid-seconds must be > 0, got {args.grid_seconds}")
    try:
        job = load_job(args.job)
    except (OSError, JobConfigError) as exc:
        raise UsageError(str(exc)) from None
    console = Console(stderr=args.json == "-")

    def trial(t: AnchorRun) -> None:
        o = t.optimizer
        console.print(f"  trial {o['kind']} lr {o['lr']:g}: best accuracy {t.best_accuracy}")

    def point(p: Point) -> None:
        console.print(f"  {p.t:7.2f} s  {p.steps:>9,} steps  accuracy {p.accuracy:.4f}  loss "
                      f"{p.loss:.4f}")  # fmt: skip

    console.print(f"anchor of {args.job}: {list(job.spec.widths)}, batch {job.data.batch}")
    anchor = anchor_of(
        job, seconds=args.seconds, grid=args.grid, grid_seconds=args.grid_seconds,
        threads=getattr(args, "threads", None), eval_every_s=args.eval_every,
        on_point=point, on_trial=trial,
    )  # fmt: skip
    r = anchor.run
    console.print(
        f"best {r.optimizer['kind']} lr {r.optimizer['lr']:g} on {r.threads} thread(s): "
        f"best accuracy [bold]{r.best_accuracy}[/bold], final {r.final_accuracy}"
    )
    if args.json:
        text = json.dumps(anchor.to_json(), indent=1)
        if args.json == "-":
            print(text)  # noqa: T201 - the CLI's output
        else:
            with open(args.json, "w") as f:
                f.write(text)
    return 0
