"""Layer-split training on digits against the same network trained whole (issue 20, item 3).

The network ([64, 128, 128, 10] by default: the job model's one hidden layer
cannot be cut sensibly, since block 0 plus its aux head would be the whole
network) is cut at ``--cut`` into two blocks on two simulated clients with the
coordinator relaying the boundary activations over ``--profile`` links
(simulations/layersplit.py, decoupled greedy learning: nn/layersplit.py).
The baseline trains the same network whole by backprop, from the same init,
on the same batches with the same optimizer, epochs and batch size. Each arm
takes the learning rate of ``--lrs`` with the best mean accuracy on a held-out
fifth of the training split (the test split is never used to choose); the
figures are test accuracy at that rate for each ``--seeds`` seed, the
difference in points (target: the split within 0.5 points of whole, the seed's
MNIST bound), and the bytes and frames per epoch in each direction with the
virtual seconds an epoch takes on the link.

The second part (``--coordinator``, on by default) runs the same comparison on
the real coordinator: ``coordinator.core.machine.Coordinator`` with two in-process client
sessions (``testkit.loopback.Loopback``: every frame wire-encoded, every
task computed by ``client.compute``), a ``[split] cut`` job (lower tasks return
their rows' boundary, which upper tasks train on as a shard: docs/protocol.md
§3.3.2) against the same job trained whole. Both are decentral-async FedAsync
(window 1), tau ``--tau`` steps of batch ``--batch`` a task, 8 shards; the whole
job takes ``epochs × rows / (tau × batch)`` results, the split job that many of
each block (twice the versions: each block sees every row ``epochs`` times). The
learning rate is chosen per arm on the held-out rows as above; the figures are
test accuracy and the bytes of every frame each way per epoch (Loopback counts
them), by message type. Loopback models no link speed, so no time is given.

    .venv/bin/python benchmarks/layer_split.py [--seeds 0,1,...] [--codec fp16] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.append(str(_HERE.parent))  # testkit: in the checkout, not the wheel

from coordinator.core.assembly import build_core  # noqa: E402
from coordinator.core.config import parse_job  # noqa: E402
from nn.data import Dataset, load_digits, split_indices  # noqa: E402
from nn.layersplit import train_whole  # noqa: E402
from nn.optim import Optimizer  # noqa: E402
from nn.spec import ModelSpec, parse_widths  # noqa: E402
from nn.threads import set_threads  # noqa: E402
from nn.train import evaluate  # noqa: E402
from protocol.limits import profile  # noqa: E402
from simulations.layersplit import DIRECTIONS, SplitConfig, per_epoch, simulate  # noqa: E402
from testkit.loopback import Loopback  # noqa: E402

#: the seed's MNIST bound (seed 002, section 9.7), in accuracy points
TARGET_POINTS = 0.5
#: the held-out fifth of the training split that chooses each arm's lr
VAL_FRACTION, VAL_SEED = 0.2, 12345


def data() -> dict[str, Any]:
    ds = load_digits()
    tr, va = split_indices(len(ds.y_train), VAL_FRACTION, VAL_SEED)
    return {
        "X": ds.X_train[tr], "y": ds.y_train[tr],
        "Xv": ds.X_train[va], "yv": ds.y_train[va],
        "Xt": ds.X_test, "yt": ds.y_test,
    }  # fmt: skip


def run_whole(d: dict, spec: ModelSpec, opt: Optimizer, seed: int, args: Any) -> dict[str, Any]:
    p = train_whole(
        spec, d["X"], d["y"], epochs=args.epochs, batch=args.batch, optimizer=opt, seed=seed
    )
    return {
        "val": evaluate(p, d["Xv"], d["yv"]).accuracy,
        "test": evaluate(p, d["Xt"], d["yt"]).accuracy,
    }


def run_split(d: dict, spec: ModelSpec, opt: Optimizer, seed: int, args: Any) -> dict[str, Any]:
    cfg = SplitConfig(
        epochs=args.epochs,
        batch=args.batch,
        slice_batches=args.slice_batches,
        codec=args.codec,
        link=profile(args.profile),
    )
    r = simulate(spec, args.cut, d["X"], d["y"], config=cfg, optimizer=opt, seed=seed)
    return {
        "val": evaluate(r.params, d["Xv"], d["yv"]).accuracy,
        "test": evaluate(r.params, d["Xt"], d["yt"]).accuracy,
        # block 0 with its aux head alone: what block 1 adds on top of it
        "test_block0_aux": evaluate(r.blocks[0].params, d["Xt"], d["yt"]).accuracy,
        "per_epoch": per_epoch(r),
        "epoch_s": r.seconds / args.epochs,
        "collect_bytes": r.collect_bytes,
    }


def run_coordinator(
    d: dict, spec: ModelSpec, lr: float, seed: int, args: Any, *, split: bool
) -> dict[str, Any]:
    """One job on the real coordinator with two loopback clients (module docstring)."""
    ds = Dataset(
        name="digits-split-bench", X_train=d["X"], y_train=d["y"],
        X_test=d["Xt"], y_test=d["yt"], num_classes=10,
    )  # fmt: skip
    tasks = args.epochs * len(d["y"]) // (args.tau * args.batch)
    job = parse_job(
        {
            "model": {"widths": list(spec.widths)},
            "data": {"shards": 8, "batch": args.batch},
            "strategy": {
                "name": "decentral-async", "tau": args.tau, "lr": lr,
                "client_optimizer": args.optimizer, "window": 1,
            },
            "eval": {"every_versions": 1 << 40},
            "stop": {"target_accuracy": None, "max_versions": tasks * (2 if split else 1)},
            "codecs": {"update": args.codec},
            **({"split": {"cut": args.cut}} if split else {}),
        }
    )  # fmt: skip
    core = build_core(job, seed=seed, dataset=ds)
    lb = Loopback(core)
    for i in range(2):
        lb.add_client(f"client-{i}", flops=1e9)
    lb.run()
    per_epoch: dict[str, dict[str, float]] = {"down": {}, "up": {}}
    for (way, kind), n in lb.carried.items():
        per_epoch[way][kind] = n / args.epochs
    return {
        "val": evaluate(core.params, d["Xv"], d["yv"]).accuracy,
        "test": evaluate(core.params, d["Xt"], d["yt"]).accuracy,
        "versions": core.version,
        "per_epoch": per_epoch,
    }


def coordinator_part(d: dict, spec: ModelSpec, seeds: list[int], lrs: list[float], args: Any):
    """Whole against split on the real coordinator, lr chosen per arm on val."""
    grids: dict[str, dict[float, list[dict]]] = {"whole": {}, "split": {}}
    for lr in lrs:
        for arm in grids:
            grids[arm][lr] = [
                run_coordinator(d, spec, lr, s, args, split=arm == "split") for s in seeds
            ]
    lr_w, lr_s = best(grids["whole"]), best(grids["split"])
    whole, split = grids["whole"][lr_w], grids["split"][lr_s]
    diffs = [100 * (w["test"] - x["test"]) for w, x in zip(whole, split, strict=True)]
    sem = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None

    def traffic(runs: list[dict]) -> dict[str, dict[str, float]]:
        kinds = {(w, k) for r in runs for w in r["per_epoch"] for k in r["per_epoch"][w]}
        out: dict[str, dict[str, float]] = {"down": {}, "up": {}}
        for w, k in sorted(kinds):
            out[w][k] = statistics.fmean(r["per_epoch"][w].get(k, 0.0) for r in runs)
        return out

    return {
        "tau": args.tau,
        "lr": {"whole": lr_w, "split": lr_s},
        "runs": [
            {"seed": s, "whole": w["test"], "split": x["test"], "points_behind": p}
            for s, w, x, p in zip(seeds, whole, split, diffs, strict=True)
        ],
        "whole_mean": statistics.fmean(w["test"] for w in whole),
        "split_mean": statistics.fmean(x["test"] for x in split),
        "points_behind_mean": statistics.fmean(diffs),
        "points_behind_sem": sem,
        "versions": {"whole": whole[0]["versions"], "split": split[0]["versions"]},
        "bytes_per_epoch": {"whole": traffic(whole), "split": traffic(split)},
    }


def best(grid: dict[float, list[dict]]) -> float:
    return max(grid, key=lambda lr: statistics.fmean(r["val"] for r in grid[lr]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9")
    ap.add_argument("--widths", default="64,128,128,10")
    ap.add_argument("--cut", type=int, default=1, help="layer index of the cut (1)")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--optimizer", default="sgd", choices=("sgd", "momentum", "adam"))
    ap.add_argument("--lrs", default="0.1,0.2,0.4,0.6,0.8")
    ap.add_argument("--codec", default="fp32", help="codec of the boundary frames (fp32)")
    ap.add_argument("--profile", default="roblox", help="link profile of both clients")
    ap.add_argument("--slice-batches", type=int, default=3, help="batches per transfer (3)")
    ap.add_argument("--tau", type=int, default=10, help="steps per task, coordinator part (10)")
    ap.add_argument(
        "--coordinator",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the comparison on the real coordinator (default: on)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.tau < 1:
        ap.error("--tau must be >= 1")
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
        lrs = [float(x) for x in args.lrs.split(",") if x.strip()]
        spec = ModelSpec(widths=parse_widths(args.widths))
    except ValueError as exc:
        ap.error(str(exc))
    if not seeds or not lrs:
        ap.error("--seeds and --lrs need at least one value each")
    set_threads(1)
    d = data()
    t0 = time.perf_counter()
    grids: dict[str, dict[float, list[dict]]] = {"whole": {}, "split": {}}
    for lr in lrs:
        opt = Optimizer(kind=args.optimizer, lr=lr)
        grids["whole"][lr] = [run_whole(d, spec, opt, s, args) for s in seeds]
        grids["split"][lr] = [run_split(d, spec, opt, s, args) for s in seeds]
    lr_w, lr_s = best(grids["whole"]), best(grids["split"])
    whole, split = grids["whole"][lr_w], grids["split"][lr_s]
    diffs = [100 * (w["test"] - s["test"]) for w, s in zip(whole, split, strict=True)]
    sem = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None
    traffic = {
        k: {q: statistics.fmean(r["per_epoch"][k][q] for r in split) for q in ("bytes", "frames")}
        for k in DIRECTIONS
    }
    out = {
        "widths": list(spec.widths),
        "cut": args.cut,
        "epochs": args.epochs,
        "batch": args.batch,
        "optimizer": args.optimizer,
        "codec": args.codec,
        "profile": args.profile,
        "slice_batches": args.slice_batches,
        "seeds": seeds,
        "train_rows": len(d["y"]),
        "test_rows": len(d["yt"]),
        "lr": {"whole": lr_w, "split": lr_s},
        "val_by_lr": {
            arm: {str(lr): statistics.fmean(r["val"] for r in g[lr]) for lr in lrs}
            for arm, g in grids.items()
        },
        "runs": [
            {
                "seed": s,
                "whole": w["test"],
                "split": x["test"],
                "split_block0_aux": x["test_block0_aux"],
                "points_behind": p,
            }
            for s, w, x, p in zip(seeds, whole, split, diffs, strict=True)
        ],
        "whole_mean": statistics.fmean(w["test"] for w in whole),
        "split_mean": statistics.fmean(x["test"] for x in split),
        "points_behind_mean": statistics.fmean(diffs),
        "points_behind_sem": sem,
        "per_epoch": traffic,
        "epoch_virtual_s": statistics.fmean(x["epoch_s"] for x in split),
        "model_bytes": spec.nbytes,
        "collect_bytes": split[0]["collect_bytes"],
        "target_points": TARGET_POINTS,
    }
    if args.coordinator:
        out["coordinator"] = coordinator_part(d, spec, seeds, lrs, args)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(
        f"{list(spec.widths)} cut at layer {args.cut}, {args.epochs} epochs of batch "
        f"{args.batch}, {args.optimizer}; lr whole {lr_w:g}, split {lr_s:g} (best on val)"
    )
    for r in out["runs"]:
        print(
            f"seed {r['seed']}: whole {100 * r['whole']:.2f} %, split {100 * r['split']:.2f} % "
            f"({r['points_behind']:+.2f} points behind; block 0's aux head alone "
            f"{100 * r['split_block0_aux']:.2f} %)"
        )
    print(
        f"mean: whole {100 * out['whole_mean']:.2f} %, split {100 * out['split_mean']:.2f} %, "
        f"{out['points_behind_mean']:+.2f} ± {sem or 0:.2f} points behind "
        f"(target <= {TARGET_POINTS})"
    )
    for k, v in traffic.items():
        print(f"{k:12s} {v['bytes'] / 1e3:9.1f} kB/epoch in {v['frames']:.0f} frames")
    print(
        f"an epoch takes {out['epoch_virtual_s']:.1f} virtual s on {args.profile} links; "
        f"the model is {spec.nbytes / 1e3:.1f} kB; wall {out['wall_s']} s"
    )
    c = out.get("coordinator")
    if c is None:
        return
    print(
        f"real coordinator, 2 loopback clients, tau {c['tau']}: lr whole {c['lr']['whole']:g}, "
        f"split {c['lr']['split']:g} (best on val); versions {c['versions']}"
    )
    for r in c["runs"]:
        print(
            f"seed {r['seed']}: whole {100 * r['whole']:.2f} %, split {100 * r['split']:.2f} % "
            f"({r['points_behind']:+.2f} points behind)"
        )
    print(
        f"mean: whole {100 * c['whole_mean']:.2f} %, split {100 * c['split_mean']:.2f} %, "
        f"{c['points_behind_mean']:+.2f} ± {c['points_behind_sem'] or 0:.2f} points behind"
    )
    for arm, t in c["bytes_per_epoch"].items():
        for way, kinds in t.items():
            line = ", ".join(f"{k} {v / 1e3:.1f}" for k, v in kinds.items())
            print(f"{arm:5s} {way:4s} kB/epoch: {line}")


if __name__ == "__main__":
    main()
