"""Update codecs on digits through the real coordinator: bytes per accepted update
and final accuracy.

Decentral-async (FedAsync, the default strategy) over ``coordinator.loopback``:
one ``Coordinator``, 8 ``ClientSession``s of mixed speed, a virtual clock, every
frame through the wire encoding and every update through ``client.compute``. The
job's ``codecs.update`` / ``codecs.error_feedback`` choose the upload codec; each
run stops after ``--updates`` model versions (one accepted update each) and the
core evaluates on the whole held-out split. Bytes per accepted update are the
coordinator's ``ResultAccepted`` counts: ``frame_bytes`` (the result frame plus
its chunk frames, exact) and ``payload_bytes`` (encoded payloads only). Downloads
are full fp32 models unless ``--delta CODEC`` turns on model deltas.

    .venv/bin/python benchmarks/compression.py [--json] [--updates 600] [--seeds 2] [--delta fp16]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# Run as a script, this file's folder is sys.path[0] and would shadow the
# ``compression`` package with this very file.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402  (installed with scikit-learn)

from coordinator import events as ev  # noqa: E402
from coordinator.config import parse_job  # noqa: E402
from coordinator.core import Coordinator  # noqa: E402
from coordinator.loopback import Loopback  # noqa: E402
from nn.data import load_dataset  # noqa: E402

CONFIGS: list[tuple[str, str, bool]] = [
    # (label, codec, error feedback)
    ("fp32", "fp32", False),
    ("fp16", "fp16", False),
    ("int8", "int8", False),
    ("int4", "int4", False),
    ("int4 + EF", "int4", True),
    ("top-k 10%", "topk:0.1", False),
    ("top-k 10% + int8", "topk:0.1+int8", False),
    ("top-k 10% + EF", "topk:0.1", True),
    ("top-k 10% + int8 + EF", "topk:0.1+int8", True),
    ("top-k 1%", "topk:0.01", False),
    ("top-k 1% + int8", "topk:0.01+int8", False),
    ("top-k 1% + EF", "topk:0.01", True),
    ("top-k 1% + int8 + EF", "topk:0.01+int8", True),
]


def run_one(codec_name: str, feedback: bool, *, seed: int, args: argparse.Namespace) -> dict:
    """One job to ``args.updates`` versions; bytes from the core's own events."""
    job = parse_job(
        {
            "model": {"widths": [int(w) for w in args.widths.split(",")], "init_seed": seed},
            "data": {"dataset": "digits", "shards": args.clients, "batch": args.batch},
            "strategy": {
                "name": "decentral-async",
                "tau": args.tau,
                "lr": args.lr,
                "alpha": args.alpha,
            },
            "eval": {"every_versions": args.updates},
            "stop": {"max_versions": args.updates},
            "codecs": {"update": codec_name, "error_feedback": feedback, "delta": args.delta},
        }
    )
    core = Coordinator(job, seed=seed, dataset=load_dataset("digits", seed=0))
    lb = Loopback(core)
    for i in range(args.clients):
        lb.add_client(f"c{i}", flops=1e8 * (1 + i % 4))  # four speeds
    lb.run(until=1e7)
    fin = core.finished
    if fin is None or fin.accuracy is None:
        raise RuntimeError(f"{codec_name}: job did not finish ({core.version} versions)")
    accepted = [o for o in lb.outputs if isinstance(o, ev.ResultAccepted)]
    leased = [o for o in lb.outputs if isinstance(o, ev.TaskLeased)]
    last = core.evaluator.last
    return {
        "frame_bytes": float(np.mean([o.frame_bytes for o in accepted])),
        "payload_bytes": float(np.mean([o.payload_bytes for o in accepted])),
        "download_bytes": float(np.mean([o.download_bytes for o in leased])),
        "accuracy": fin.accuracy,
        "loss": last.loss if last is not None else float("nan"),
        "mean_staleness": float(np.mean([o.staleness for o in accepted])),
        "accepted": len(accepted),
    }


def row(label: str, codec_name: str, feedback: bool, args: argparse.Namespace) -> dict:
    """One table row: ``args.seeds`` runs of one configuration, averaged."""
    runs = [run_one(codec_name, feedback, seed=s, args=args) for s in range(args.seeds)]
    mean = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
    return {
        "config": label,
        "codec": codec_name,
        "error_feedback": feedback,
        "bytes_per_update": mean["frame_bytes"],
        "payload_bytes_per_update": mean["payload_bytes"],
        "download_bytes_per_task": mean["download_bytes"],
        "accuracy": mean["accuracy"],
        "accuracy_runs": [r["accuracy"] for r in runs],
        "loss": mean["loss"],
        "mean_staleness": mean["mean_staleness"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--updates", type=int, default=600, help="accepted updates (versions) per run")
    ap.add_argument("--seeds", type=int, default=2, help="runs per codec (results are averaged)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--tau", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--alpha", type=float, default=0.6, help="FedAsync mixing weight")
    ap.add_argument("--widths", default="64,128,10")
    ap.add_argument("--delta", default=None, help="download delta codec (default: full models)")
    ap.add_argument("--only", help="comma-separated labels to run (default: all)")
    args = ap.parse_args(argv)
    configs = CONFIGS
    if args.only:
        wanted = {s.strip() for s in args.only.split(",")}
        configs = [c for c in CONFIGS if c[0] in wanted]
    t0 = time.perf_counter()
    rows = []
    # small GEMMs: one BLAS thread (two spin against each other on a busy machine)
    with threadpool_limits(1):
        for label, codec_name, feedback in configs:
            rows.append(row(label, codec_name, feedback, args))
    fp32 = next((r for r in rows if r["codec"] == "fp32" and not r["error_feedback"]), None)
    for r in rows:
        if fp32 is not None:
            r["reduction_vs_fp32"] = fp32["bytes_per_update"] / r["bytes_per_update"]
            r["payload_reduction_vs_fp32"] = (
                fp32["payload_bytes_per_update"] / r["payload_bytes_per_update"]
            )
            r["accuracy_loss_points"] = 100 * (fp32["accuracy"] - r["accuracy"])
            r["meets_goal"] = r["reduction_vs_fp32"] >= 16 and r["accuracy_loss_points"] <= 0.5
    report = {
        "benchmark": "compression",
        "kind": "real coordinator (coordinator.loopback), decentral-async fedasync",
        "dataset": "digits",
        "widths": [int(w) for w in args.widths.split(",")],
        "clients": args.clients,
        "tau": args.tau,
        "batch": args.batch,
        "lr": args.lr,
        "alpha": args.alpha,
        "updates": args.updates,
        "seeds": args.seeds,
        "delta": args.delta,
        "goal": ">= 16x fewer frame bytes per update than fp32 at <= 0.5 point accuracy loss",
        "rows": rows,
        "wall_s": time.perf_counter() - t0,
    }
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
        return 0
    print(f"{report['kind']}; digits {report['widths']}, {args.clients} clients, tau={args.tau}, "
          f"{args.updates} updates, mean of {args.seeds} seeds")  # fmt: skip
    print(
        f"{'config':<24}{'frame B/upd':>12}{'x fewer':>9}{'payload B':>11}{'x fewer':>9}"
        f"{'accuracy':>10}{'loss pts':>10}  goal"
    )
    for r in rows:
        print(
            f"{r['config']:<24}{r['bytes_per_update']:>12,.0f}{r.get('reduction_vs_fp32', 0):>9.1f}"
            f"{r['payload_bytes_per_update']:>11,.0f}{r.get('payload_reduction_vs_fp32', 0):>9.1f}"
            f"{r['accuracy']:>10.4f}{r.get('accuracy_loss_points', 0):>10.2f}"
            f"  {'yes' if r.get('meets_goal') else ''}"
        )
    print(f"download bytes per task: {rows[0]['download_bytes_per_task']:,.0f}; "
          f"wall {report['wall_s']:.1f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
