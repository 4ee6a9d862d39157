"""``crowdgrad plan``: predict how much faster N volunteers train than one machine.

Before renting any players: for each strategy, the predicted wall time of a run
and its speedup over one machine doing every step itself. Two ways in: measured
``--t-grad`` (one mini-batch gradient on a client) and ``--t-comm`` (one transfer
of the weights), or a model plus a link profile and compute rates, from which
both are derived (simulations/plan.py has the formulas, after the data-parallel
estimator of seed 001). ``--scenario`` also runs the simulator on a scenario
file and puts its measured times beside the estimate. Below the table the
command says in words what the numbers mean and what would raise the speedup.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from crowdgrad.cli import UsageError
from nn.spec import ModelSpec, parse_widths
from protocol.limits import PROFILES, profile
from simulations.plan import (
    PlanInputs,
    estimate,
    inputs_from_model,
    job_bytes_per_param,
    job_prefetches,
)
from simulations.runner import run_scenario
from simulations.scenario import (
    MACHINE_FLOPS,
    PLAYER_FLOPS,
    load_raw,
    parse_scenario,
    resolve,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="predict each strategy's time and speedup over one machine",
        description=__doc__,
    )
    p.add_argument("--t-grad", type=float, help="measured seconds for one mini-batch gradient")
    p.add_argument("--t-comm", type=float, help="measured seconds for one weights transfer")
    p.add_argument("--preset", help="model preset (instead of --t-grad/--t-comm)")
    p.add_argument("--widths", help="model widths, e.g. 64,128,10 (instead of --preset)")
    p.add_argument("--profile", default="roblox", choices=sorted(PROFILES), help="link profile")
    p.add_argument("--latency", type=float, default=0.0, help="one-way latency, seconds")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--client-flops", type=float, default=PLAYER_FLOPS, help="FLOP/s of a player")
    p.add_argument("--server-flops", type=float, default=MACHINE_FLOPS, help="FLOP/s, one machine")
    p.add_argument(
        "--bytes-per-param", type=float, default=4.0, help="4 fp32, 2 fp16, ~1 int8 updates"
    )
    p.add_argument("--workers", default="8", help="number of clients, or a list: 1,2,4,8")
    p.add_argument("--steps", type=int, default=100, help="mini-batch steps in total (D)")
    p.add_argument("--tau", type=int, default=10, help="local steps per exchange")
    p.add_argument(
        "--contention",
        choices=("shared", "independent"),
        help="one shared server link (seed 001) or a link per client; "
        "default shared with --t-grad, independent with a model",
    )
    p.add_argument(
        "--prefetch",
        action="store_true",
        help="decentral-async clients fetch their next task while they compute "
        "(independent links; a scenario says so itself)",
    )
    p.add_argument(
        "--scenario",
        help="a scenario (file or shipped name): estimate from it and run the simulator too",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def _inputs(args: argparse.Namespace, workers: int) -> PlanInputs:
    measured = args.t_grad is not None or args.t_comm is not None
    model = args.preset is not None or args.widths is not None
    if measured == model:
        raise UsageError("give either --t-grad and --t-comm, or --preset/--widths")
    if measured:
        if args.t_grad is None or args.t_comm is None:
            raise UsageError("--t-grad and --t-comm go together")
        contention = args.contention or ("independent" if args.prefetch else "shared")
        return _checked(
            PlanInputs,
            t_grad=args.t_grad,
            t_comm=args.t_comm,
            workers=workers,
            steps=args.steps,
            tau=args.tau,
            contention=contention,
            prefetch=args.prefetch,
        )
    if args.preset is not None and args.widths is not None:
        raise UsageError("give --preset or --widths, not both")
    spec = (
        ModelSpec.preset(args.preset)
        if args.preset is not None
        else ModelSpec(widths=parse_widths(args.widths))
    )
    return _checked(
        inputs_from_model,
        spec,
        limits=profile(args.profile),
        workers=workers,
        batch=args.batch,
        client_flops=args.client_flops,
        server_flops=args.server_flops,
        latency=args.latency,
        steps=args.steps,
        tau=args.tau,
        bytes_per_param=args.bytes_per_param,
        contention=args.contention or "independent",
        prefetch=args.prefetch,
    )


def _checked(make: Any, *args: Any, **kwargs: Any) -> PlanInputs:
    """The estimator's inputs; what it refuses is a usage error naming why."""
    try:
        return make(*args, **kwargs)  # type: ignore[no-any-return]
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def scenario_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Estimate for the scenario's own setting, plus what the simulator measures."""
    data = load_raw(resolve(args.scenario))
    data.pop("sweep", None)
    sc = parse_scenario(data, source=args.scenario)
    steps = sc.run.max_steps or args.steps
    job = sc.job
    prefetch = sc.clients.prefetch and job_prefetches(job, sc.limits)
    p = _checked(
        inputs_from_model,
        sc.job.spec,
        limits=sc.limits,
        workers=sc.clients.count,
        batch=sc.job.data.batch,
        client_flops=sc.clients.compute.mean,
        server_flops=sc.server.compute,
        latency=sc.clients.latency.mean,
        steps=steps,
        tau=sc.job.strategy.nominal_tau,
        bytes_per_param=job_bytes_per_param(job, sc.limits, sc.clients.count),  # its link's
        contention=args.contention or "independent",
        prefetch=prefetch,
    )
    rows = [
        {"workers": p.workers, "t_grad": p.t_grad, "t_comm": p.t_comm,
         "contention": p.contention, "prefetch": p.prefetch, **e.to_dict()}
        for e in estimate(p)
        if e.strategy in ("linear", sc.job.strategy.name)
    ]  # fmt: skip
    result = run_scenario(sc)
    s = result.summary
    rows.append(
        {"workers": p.workers, "t_grad": p.t_grad, "t_comm": p.t_comm,
         "contention": "simulated", "prefetch": p.prefetch,
         "strategy": f"{sc.job.strategy.name} (simulated)",
         "seconds": s.get("seconds"), "speedup": s.get("speedup")}
    )  # fmt: skip
    return rows


def plan_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.scenario:
        return scenario_rows(args)
    try:
        counts = [int(w) for w in str(args.workers).split(",") if w.strip()]
    except ValueError:
        raise UsageError(f"--workers: expected integers, got {args.workers!r}") from None
    rows = []
    for n in counts:
        p = _inputs(args, n)
        for e in estimate(p):
            rows.append(
                {
                    "workers": n,
                    "t_grad": p.t_grad,
                    "t_comm": p.t_comm,
                    "contention": p.contention,
                    "prefetch": p.prefetch,
                    **e.to_dict(),
                }
            )
    return rows


def run(args: argparse.Namespace) -> int:
    rows = plan_rows(args)
    if args.json:
        sys.stdout.write(json.dumps({"estimates": rows}, indent=2) + "\n")
        return 0
    first = rows[0]
    table = Table(
        title="Estimated time "
        f"(t_grad {first['t_grad']:.4g} s, t_comm {first['t_comm']:.4g} s, "
        f"{first['contention']} links{', prefetch' if first['prefetch'] else ''})"
    )
    for col in ("clients", "strategy", "seconds", "speedup"):
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for r in rows:
        table.add_row(str(r["workers"]), r["strategy"], f"{r['seconds']:.4g}", speedup_text(r))
    console = Console()
    console.print(table)
    for line in explain(rows, args):
        console.print(line, markup=False, highlight=False)
    return 0


def speedup_text(row: dict[str, Any]) -> str:
    """``2.31x``; small ones keep two significant digits (``0.0013x``), never ``0.00x``."""
    x = row.get("speedup")
    if x is None:
        return "—"
    return f"{x:.2f}x" if x >= 0.01 else f"{x:.2g}x"


def explain(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    """What the table says, in words: its columns, the two inputs, and what a
    speedup below 1 means and what would raise it."""
    first = rows[0]
    t_grad, t_comm = first["t_grad"], first["t_comm"]
    steps = "the scenario's" if getattr(args, "scenario", None) else f"{args.steps}"
    lines = [
        "",
        "How to read it: 'linear' is one machine doing every mini-batch step itself, the "
        "baseline; 'seconds' is the predicted wall time of the whole run "
        f"({steps} mini-batch steps in total); 'speedup' is linear's seconds divided by "
        "the row's (2x: twice as fast as one machine).",
        f"Inputs: t_grad = {t_grad:.3g} s for one mini-batch gradient on a client, t_comm = "
        f"{t_comm:.3g} s to send the model's weights once over a client's link.",
    ]
    crowd = [r for r in rows if r["strategy"] != "linear" and r.get("speedup") is not None]
    if not crowd:
        return lines
    best = max(crowd, key=lambda r: r["speedup"])
    if best["speedup"] >= 1:
        lines.append(
            f"The crowd beats one machine: best here {best['strategy']} with {best['workers']} "
            f"clients at {speedup_text(best)}."
        )
        return lines
    ratio = t_comm / t_grad if t_grad > 0 else float("inf")
    lines.append(
        "Every speedup here is below 1: the crowd would finish later than one machine alone. "
        f"Sending the model once takes as long as {ratio:,.0f} gradient steps, so the links, "
        "not the compute, set the pace."
    )
    lines.append(
        "What raises it: more local steps per exchange (--tau, decentral strategies), smaller "
        "updates (--bytes-per-param 1 for int8; top-k codecs send less still), faster links "
        "(--profile lan, or a smaller --t-comm), more compute per byte sent (a larger --batch), "
        "and --prefetch (decentral-async fetches while it computes)."
    )
    return lines
