"""``crowdgrad simulate SCENARIO -o DIR``: run a scenario in virtual time and report.

SCENARIO is a TOML file or the name of a shipped one (``crowdgrad simulate
--list``). Without ``--sweep`` the scenario runs once as written (its
``[sweep]`` table ignored); with it, every point of the grid runs, one after
the other or, with ``--ray [ADDRESS]``, as Ray tasks on a local Ray started
for the run (``--ray-cpus``) or on a cluster (simulations/distributed.py; the
results are byte-identical). ``--set key=value`` overrides a field by its
dotted path (value parsed as TOML).
Writes results.json, timeseries.csv, accuracy/bytes/clients PNGs and summary.md.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from crowdgrad.cli import UsageError
from simulations.distributed import run_point, run_points_on_ray
from simulations.report import write_report
from simulations.scenario import expand_sweep, load_raw, resolve, shipped


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate", help="run a scenario in virtual time and write a report", description=__doc__
    )
    p.add_argument("scenario", nargs="?", help="scenario TOML file or shipped scenario name")
    p.add_argument("-o", "--out", help="output directory")
    p.add_argument("--sweep", action="store_true", help="run every point of the [sweep] grid")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a field"
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="run the points as Ray tasks: on a local Ray, or on the cluster at ADDRESS",
    )
    p.add_argument(
        "--ray-cpus", type=int, default=None, metavar="N", help="CPUs of the local Ray (all)"
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--list", action="store_true", help="list the shipped scenarios and what each shows"
    )
    p.set_defaults(func=run)


def _override(data: dict[str, Any], assignment: str) -> None:
    key, sep, text = assignment.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"--set {assignment!r}: expected KEY=VALUE")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text  # a bare word: take it as a string
    node = data
    parts = key.strip().split(".")
    for k in parts[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise UsageError(f"--set {key}: {k!r} is not a table")
    node[parts[-1]] = value


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    if args.list:
        sys.stdout.write(scenario_list())
        return 0
    if not args.scenario or not args.out:
        raise UsageError("need a SCENARIO and -o DIR (or --list)")
    path = resolve(args.scenario)
    data = load_raw(path)
    for a in args.set:
        _override(data, a)
    if not args.sweep:
        data.pop("sweep", None)
    if args.ray_cpus is not None and args.ray_cpus < 1:
        raise UsageError(f"--ray-cpus: expected an integer >= 1, got {args.ray_cpus}")
    if args.ray_cpus is not None and args.ray not in (None, "local"):
        raise UsageError("--ray-cpus sizes a local Ray; a cluster has its own CPUs")
    points = expand_sweep(data, source=str(path))
    labels = [
        ", ".join(f"{k.split('.')[-1]}={v}" for k, v in point.items()) or scenario.name
        for point, scenario in points
    ]
    if args.ray is not None:
        runs = _run_on_ray(args, points, labels, console)
    else:
        runs = _run_in_turn(args, points, labels, console)
    out = write_report(runs, args.out, plots=not args.no_plots)
    if not args.quiet:
        console.print(f"wrote {out}/results.json, timeseries.csv, summary.md and plots")
    sys.stdout.write((out / "summary.md").read_text(encoding="utf-8"))
    sys.stdout.write(how_to_read(runs))
    return 0


def _run_in_turn(args: argparse.Namespace, points, labels, console: Console) -> list[Any]:
    runs = []
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[t]:.0f} virtual s"),
        TimeElapsedColumn(),
        console=console,
        disable=args.quiet,
    ) as progress:
        for i, ((point, scenario), label) in enumerate(zip(points, labels, strict=True)):
            task = progress.add_task(f"[{i + 1}/{len(points)}] {label}", total=1.0, t=0.0)

            def tick(now: float, horizon: float, task: Any = task) -> None:
                frac = now / horizon if horizon and horizon != float("inf") else 0.0
                progress.update(task, completed=min(1.0, frac), t=now)

            runs.append(run_point(scenario, label, point, threads=args.threads, progress=tick))
            progress.update(task, completed=1.0)
    return runs


def _run_on_ray(args: argparse.Namespace, points, labels, console: Console) -> list[Any]:
    where = "a local Ray" if args.ray == "local" else f"the Ray cluster at {args.ray}"
    if not args.quiet:
        console.print(f"running {len(points)} scenario(s) on {where}")
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=args.quiet,
    ) as progress:
        task = progress.add_task("scenarios finished", total=len(points))
        try:
            return run_points_on_ray(
                [(label, point, sc) for (point, sc), label in zip(points, labels, strict=True)],
                address=None if args.ray == "local" else args.ray,
                num_cpus=args.ray_cpus,
                threads=args.threads,
                on_done=lambda i, r: progress.advance(task),
            )
        except (RuntimeError, ConnectionError) as exc:
            raise UsageError(str(exc)) from exc


def scenario_list() -> str:
    """``--list``: each shipped scenario with its description and how many runs it makes."""
    rows = []
    for name in shipped():
        path = resolve(name)
        data = load_raw(path)
        runs = len(expand_sweep(data, source=str(path))) if "sweep" in data else 1
        sweep = f" [--sweep: {runs} runs]" if runs > 1 else ""
        rows.append((name, f"{data.get('description', '')}{sweep}"))
    width = max(len(n) for n, _ in rows)
    lines = ["Shipped scenarios (crowdgrad simulate NAME -o DIR; docs/simulations.md):"]
    lines += [f"  {n:<{width}}  {d}" for n, d in rows]
    return "\n".join(lines) + "\n"


def how_to_read(runs: list[Any]) -> str:
    """The summary table's columns and its speedup, in words."""
    text = (
        "\nHow to read it: 'virtual s' is simulated time, not how long this command took; "
        "'steps' are mini-batch steps by all players together and 'versions' the model "
        "versions they made; 'linear s' is one machine doing the same steps alone, and "
        "'speedup' is linear s divided by virtual s (2x: the players finished in half the "
        "time). 'mode' numerics trains for real, cost times the schedule without numerics; "
        "'seed s' and 'seed speedup' are the published figures for the same setting.\n"
    )
    speedups = [r.summary.get("speedup") for r in runs]
    if any(s is not None and s < 1 for s in speedups):
        text += (
            "A speedup below 1 means the players took longer than one machine would: sending "
            "models and updates over their links costs more time than their compute saves. "
            "It rises with more local steps per exchange (strategy.tau), smaller updates "
            "(codecs.update, e.g. topk:0.01+int8), faster links (link.profile), bigger "
            "batches, and prefetch; crowdgrad plan estimates each in seconds.\n"
        )
    return text
