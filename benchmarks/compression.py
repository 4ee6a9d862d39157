"""Update codecs on digits: bytes per accepted update and final accuracy.

IN-PROCESS APPROXIMATION of decentralized async training, not the coordinator:
8 simulated clients, each with an iid shard, take ``tau`` local SGD steps from
the model version they downloaded and upload ``local − base`` encoded block by
block (neuron groups from ``plan_groups``: W rows and biases separately, the
protocol's chunking). The "server" decodes and merges each delta on arrival
with the coordinator's default FedAsync rule, ``params += alpha·(1+s)^-0.5·delta``
(alpha 0.6, s = staleness in versions), in the order of virtual finish times
(per-client step times drawn from a seeded lognormal); then the client
downloads the current model (fp32, not counted) and starts again. Bytes are
codec payload bytes only (no framing). Every update is
accepted (no validation here). The lead will switch this to the real
coordinator; the codec effect on bytes and accuracy is what this measures.

    .venv/bin/python benchmarks/compression.py [--json] [--updates 600] [--seeds 3]
"""

from __future__ import annotations

import argparse
import heapq
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

from compression import get  # noqa: E402
from compression.feedback import ErrorFeedback  # noqa: E402
from nn.data import load_digits, shard  # noqa: E402
from nn.optim import Optimizer, OptState  # noqa: E402
from nn.params import Params, plan_groups  # noqa: E402
from nn.spec import ModelSpec  # noqa: E402
from nn.train import evaluate, train_steps  # noqa: E402

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


def run_one(
    codec_name: str,
    feedback: bool,
    *,
    seed: int,
    updates: int,
    clients: int,
    tau: int,
    batch: int,
    lr: float,
    widths: tuple[int, ...],
    group_values: int,
    alpha: float,
) -> dict:
    data = load_digits(seed=0)
    spec = ModelSpec(widths=widths)
    model = spec.init_params(seed)
    codec = get(codec_name)
    groups = plan_groups(spec, group_values)
    shards = [(data.X_train[i], data.y_train[i]) for i in shard(data.y_train, clients, seed=seed)]
    rng = np.random.default_rng(seed)
    step_time = rng.lognormal(0.0, 0.5, clients)  # heterogeneous client speeds
    opt = Optimizer(kind="sgd", lr=lr)
    efs = [ErrorFeedback(codec) for _ in range(clients)] if feedback else None
    client_rngs = [np.random.default_rng([seed, c]) for c in range(clients)]
    bases = [model.copy() for _ in range(clients)]
    events = [(tau * step_time[c] * (1 + 0.1 * rng.random()), c) for c in range(clients)]
    heapq.heapify(events)
    total_bytes = 0
    staleness = []
    versions = [0] * clients
    for version in range(updates):
        now, c = heapq.heappop(events)
        local = bases[c].copy()
        X, y = shards[c]
        train_steps(local, OptState.init(opt, spec), X, y, tau, batch, client_rngs[c])
        delta = local - bases[c]
        decoded = Params.zeros(spec)
        for g in groups:
            for part, sl in zip("Wb", delta.group_slices(g), strict=True):
                block = delta.data[sl]
                if part == "W":
                    block = block.reshape(g.rows, -1)
                if efs is not None:
                    payload = efs[c].encode((g, part), block, rng=client_rngs[c])
                else:
                    payload = codec.encode(block, rng=client_rngs[c])
                total_bytes += len(payload)
                decoded.data[sl] = get(int(codec.id)).decode(payload, block.shape).reshape(-1)
        s = version - versions[c]
        model.add_(decoded, scale=alpha * (1.0 + s) ** -0.5)
        staleness.append(s)
        bases[c] = model.copy()
        versions[c] = version + 1
        heapq.heappush(events, (now + tau * step_time[c], c))
    result = evaluate(model, data.X_test, data.y_test)
    return {
        "bytes_per_update": total_bytes / updates,
        "accuracy": result.accuracy,
        "loss": result.loss,
        "mean_staleness": float(np.mean(staleness)),
    }


def row(label: str, codec_name: str, feedback: bool, args: argparse.Namespace, widths) -> dict:
    """One table row: ``args.seeds`` runs of one configuration, accuracy averaged."""
    runs = [
        run_one(
            codec_name,
            feedback,
            seed=s,
            updates=args.updates,
            clients=args.clients,
            tau=args.tau,
            batch=args.batch,
            lr=args.lr,
            widths=widths,
            group_values=args.group_values,
            alpha=args.alpha,
        )
        for s in range(args.seeds)
    ]
    return {
        "config": label,
        "codec": codec_name,
        "error_feedback": feedback,
        "bytes_per_update": runs[0]["bytes_per_update"],
        "accuracy": float(np.mean([r["accuracy"] for r in runs])),
        "accuracy_runs": [r["accuracy"] for r in runs],
        "loss": float(np.mean([r["loss"] for r in runs])),
        "mean_staleness": float(np.mean([r["mean_staleness"] for r in runs])),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--updates", type=int, default=600, help="accepted updates per run")
    ap.add_argument("--seeds", type=int, default=3, help="runs per codec (accuracy is averaged)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--tau", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--alpha", type=float, default=0.6, help="FedAsync mixing weight")
    ap.add_argument("--widths", default="64,128,10")
    ap.add_argument("--group-values", type=int, default=4096, help="values per neuron group")
    ap.add_argument("--only", help="comma-separated labels to run (default: all)")
    args = ap.parse_args(argv)
    widths = tuple(int(w) for w in args.widths.split(","))
    configs = CONFIGS
    if args.only:
        wanted = {s.strip() for s in args.only.split(",")}
        configs = [c for c in CONFIGS if c[0] in wanted]
    t0 = time.perf_counter()
    rows = []
    # small GEMMs: one BLAS thread (two spin against each other on a busy machine)
    with threadpool_limits(1):
        for label, codec_name, feedback in configs:
            rows.append(row(label, codec_name, feedback, args, widths))
    fp32 = next((r for r in rows if r["codec"] == "fp32" and not r["error_feedback"]), None)
    for r in rows:
        if fp32 is not None:
            r["reduction_vs_fp32"] = fp32["bytes_per_update"] / r["bytes_per_update"]
            r["accuracy_loss_points"] = 100 * (fp32["accuracy"] - r["accuracy"])
            r["meets_goal"] = r["reduction_vs_fp32"] >= 16 and r["accuracy_loss_points"] <= 0.5
    report = {
        "benchmark": "compression",
        "kind": "in-process approximation of decentral-async (not the coordinator)",
        "dataset": "digits",
        "widths": list(widths),
        "clients": args.clients,
        "tau": args.tau,
        "batch": args.batch,
        "lr": args.lr,
        "alpha": args.alpha,
        "updates": args.updates,
        "seeds": args.seeds,
        "goal": ">= 16x fewer bytes per update than fp32 at <= 0.5 point accuracy loss",
        "rows": rows,
        "wall_s": time.perf_counter() - t0,
    }
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
        return 0
    print(f"{report['kind']}; digits {list(widths)}, {args.clients} clients, tau={args.tau}, "
          f"{args.updates} updates, mean of {args.seeds} seeds")  # fmt: skip
    print(
        f"{'config':<24}{'bytes/update':>14}{'x fewer':>9}{'accuracy':>10}"
        f"{'loss pts':>10}{'test loss':>11}  goal"
    )
    for r in rows:
        print(
            f"{r['config']:<24}{r['bytes_per_update']:>14,.0f}{r.get('reduction_vs_fp32', 0):>9.1f}"
            f"{r['accuracy']:>10.4f}{r.get('accuracy_loss_points', 0):>10.2f}{r['loss']:>11.4f}"
            f"  {'yes' if r.get('meets_goal') else ''}"
        )
    print(f"wall {report['wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
