"""Codecs on digits through the real coordinator: bytes per task, down and up, and
final accuracy.

Decentral-async, classic FedAsync (``strategy.window`` 1 unless ``--window``), over
``testkit.loopback``: one ``Coordinator``, 8 ``ClientSession``s of mixed speed,
a virtual clock, every frame through the wire encoding and every update through
``client.compute``. Each row sets the upload codec (``codecs.update``,
``codecs.error_feedback``) and how models go down: full fp32 models, or deltas
(``codecs.delta``, ``max_delta_chain``, ``delta_versions``). A run stops after
``--updates`` model versions (one accepted update each) and the core evaluates
on the whole held-out split.

Bytes are the coordinator's own events, every frame, exact:

* down: ``TaskLeased.task_bytes`` (the task frame) + ``TaskLeased.download_bytes``
  (its model or delta chunk frames) + ``DataServed.frame_bytes`` (shard data,
  fetched once per client and shard);
* up: ``ResultAccepted.frame_bytes`` (the result frame and its chunk frames).

*Whole run*: all of them over the accepted updates (first downloads, shard
fetches, tasks cut off at the end included). *Steady state*: the tasks leased in
the second half of the run (model version >= updates/2): their mean down (shard
data fetched then counts too) plus the mean up of their accepted results. The
goal is on the steady-state total: >= 16x fewer bytes per task than the dense
baseline (fp32 uploads, full fp32 downloads) at <= 0.5 accuracy points.
``wire`` is every frame the loopback carried, control frames (hello, acks,
fetch, bye) included; the test holds the event counts equal to the loopback's
frames of those types.

    .venv/bin/python benchmarks/compression.py [--json] [--updates 600] [--seeds 6]
        [--rows upload,delta,extra] [--delta fp32,fp16,...] [--only LABEL,...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Run as a script, this file's folder is sys.path[0] and would shadow the
# ``compression`` package with this very file.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.append(str(_HERE.parent))  # testkit: in the checkout, not the wheel

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402  (installed with scikit-learn)

from coordinator.core import events as ev  # noqa: E402
from coordinator.core.assembly import build_core  # noqa: E402
from coordinator.core.config import parse_job  # noqa: E402
from coordinator.core.machine import Coordinator  # noqa: E402
from nn.data import load_dataset  # noqa: E402
from testkit.loopback import Loopback  # noqa: E402

GOAL_X = 16.0
GOAL_POINTS = 0.5


@dataclass(frozen=True, slots=True)
class Config:
    """One row: the upload codec, and full downloads (``delta`` None) or deltas."""

    label: str
    update: str
    feedback: bool = False
    delta: str | None = None
    max_delta_chain: int = 16
    delta_versions: int = 16

    @property
    def down(self) -> str:
        if self.delta is None:
            return "full fp32"
        return f"delta {self.delta}, chain {self.max_delta_chain}, keep {self.delta_versions}"


BASELINE = Config("fp32", "fp32")
BEST_UPLOAD = ("top-k 1% + int8 + EF", "topk:0.01+int8", True)
UPLOAD_ROWS: list[Config] = [
    BASELINE,
    Config("fp16", "fp16"),
    Config("int8", "int8"),
    Config("int4", "int4"),
    Config("int4 + EF", "int4", True),
    Config("top-k 10%", "topk:0.1"),
    Config("top-k 10% + int8", "topk:0.1+int8"),
    Config("top-k 10% + EF", "topk:0.1", True),
    Config("top-k 10% + int8 + EF", "topk:0.1+int8", True),
    Config("top-k 1%", "topk:0.01"),
    Config("top-k 1% + int8", "topk:0.01+int8"),
    Config("top-k 1% + EF", "topk:0.01", True),
    Config(*BEST_UPLOAD),
]
#: delta codecs of the ``--delta`` sweep (each with fp32 and the best uploads)
DELTA_CODECS = "fp32,fp16,int8,int4,topk:0.1+int8,topk:0.01+int8"
#: what it takes beyond the job defaults, with the best uploads: more versions
#: kept (slow clients' versions are evicted at 16), longer chains, k between
DELTA_EXTRA: list[tuple[str, int, int]] = [
    # (delta codec, max_delta_chain, delta_versions)
    ("topk:0.1+int8", 16, 32),
    ("topk:0.1+int8", 64, 64),
    ("topk:0.05+int8", 32, 32),
    ("topk:0.05+int8", 64, 64),
    ("topk:0.04+int8", 48, 48),
    ("topk:0.03+int8", 32, 32),
    ("topk:0.01+int8", 16, 32),
    ("topk:0.01+int8", 64, 64),
]


def delta_rows(codecs: list[str]) -> list[Config]:
    """Delta downloads under each codec at the job defaults, with fp32 uploads and
    with the best ones."""
    label, update, fb = BEST_UPLOAD
    return [Config("fp32", "fp32", delta=d) for d in codecs] + [
        Config(label, update, fb, delta=d) for d in codecs
    ]


def extra_rows() -> list[Config]:
    """The best uploads with the ``DELTA_EXTRA`` downloads: what reaching the goal takes."""
    label, update, fb = BEST_UPLOAD
    return [Config(label, update, fb, d, c, k) for d, c, k in DELTA_EXTRA]


def run_one(cfg: Config, *, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One job to ``args.updates`` versions; byte sums from the core's own events."""
    codecs: dict[str, Any] = {"update": cfg.update, "error_feedback": cfg.feedback}
    if cfg.delta is not None:
        codecs |= {
            "delta": cfg.delta,
            "max_delta_chain": cfg.max_delta_chain,
            "delta_versions": cfg.delta_versions,
        }
    window = args.window if args.window == "auto" else int(args.window)
    job = parse_job(
        {
            "model": {"widths": [int(w) for w in args.widths.split(",")], "init_seed": seed},
            "data": {"dataset": "digits", "shards": args.clients, "batch": args.batch},
            "strategy": {
                "name": "decentral-async",
                "tau": args.tau,
                "lr": args.lr,
                "alpha": args.alpha,
                "window": window,
            },
            "eval": {"every_versions": args.updates},
            "stop": {"max_versions": args.updates},
            "codecs": codecs,
        }
    )
    core = build_core(job, seed=seed, dataset=load_dataset("digits", seed=0))
    lb = Loopback(core)
    for i in range(args.clients):
        lb.add_client(f"c{i}", flops=1e8 * (1 + i % 4))  # four speeds
    lb.run(until=1e7)
    fin = core.finished
    if fin is None or fin.accuracy is None:
        raise RuntimeError(f"{cfg.label}: job did not finish ({core.version} versions)")
    leased = [o for o in lb.outputs if isinstance(o, ev.TaskLeased)]
    accepted = [o for o in lb.outputs if isinstance(o, ev.ResultAccepted)]
    served = [o for o in lb.outputs if isinstance(o, ev.DataServed)]
    n = len(accepted)
    # steady state: the second half of the run
    late = [o for o in leased if o.version >= args.updates // 2]
    late_ids = {o.task_id for o in late}
    late_up = [o.frame_bytes for o in accepted if o.task_id in late_ids]
    late_data = sum(o.frame_bytes for o in served if o.now >= late[0].now) if late else 0
    per_client = [sum(o.client_id == c for o in accepted) for c in lb.clients]
    kinds = [o.download for o in leased]
    last = core.evaluator.last
    return {
        # event sums over the whole run (the test checks them against the wire)
        "down_task": sum(o.task_bytes for o in leased),
        "down_model": sum(o.download_bytes for o in leased),
        "down_data": sum(o.frame_bytes for o in served),
        "up": sum(o.frame_bytes for o in accepted),
        "up_payload": sum(o.payload_bytes for o in accepted),
        "wire_down": sum(b for (d, _), b in lb.carried.items() if d == "down"),
        "wire_up": sum(b for (d, _), b in lb.carried.items() if d == "up"),
        "carried": {f"{d}:{t}": b for (d, t), b in sorted(lb.carried.items())},
        "accepted": n,
        "leased": len(leased),
        "tasks_per_client": n / len(lb.clients),
        "tasks_per_client_min": min(per_client),
        "tasks_per_client_max": max(per_client),
        "downloads": {k: kinds.count(k) for k in ("seed", "none", "full", "delta")},
        "steady_down": (
            (sum(o.task_bytes + o.download_bytes for o in late) + late_data) / len(late)
        ),
        "steady_up": float(np.mean(late_up)),
        "accuracy": fin.accuracy,
        "loss": last.loss if last is not None else float("nan"),
        "mean_staleness": float(np.mean([o.staleness for o in accepted])),
        "drift": client_drift(core, lb),
    }


def client_drift(core: Coordinator, lb: Loopback) -> float | None:
    """Mean ``|client − server| / |server|`` of the clients' models at the end, for
    the clients whose version the core still keeps (deltas only; None otherwise)."""
    deltas = core.downloads.deltas
    if deltas is None:
        return None
    rel = []
    for c in lb.clients.values():
        s = c.session
        snap = None if s.model_version is None else deltas.history.get(s.model_version)
        if s.model is not None and snap is not None:
            rel.append(float(np.linalg.norm(s.model.data - snap) / np.linalg.norm(snap)))
    return float(np.mean(rel)) if rel else None


def row(cfg: Config, args: argparse.Namespace) -> dict[str, Any]:
    """One table row: ``args.seeds`` runs of one configuration, per-task figures
    averaged over them."""
    runs = [run_one(cfg, seed=s, args=args) for s in range(args.seeds)]

    def mean(f: Any) -> float:
        return float(np.mean([f(r) for r in runs]))

    drifts = [r["drift"] for r in runs if r["drift"] is not None]
    down = mean(lambda r: (r["down_task"] + r["down_model"] + r["down_data"]) / r["accepted"])
    up = mean(lambda r: r["up"] / r["accepted"])
    return {
        "config": cfg.label,
        "codec": cfg.update,
        "error_feedback": cfg.feedback,
        "delta": cfg.delta,
        "max_delta_chain": cfg.max_delta_chain if cfg.delta else None,
        "delta_versions": cfg.delta_versions if cfg.delta else None,
        "download": cfg.down,
        # whole run, per accepted update
        "down_bytes": down,
        "down_task_bytes": mean(lambda r: r["down_task"] / r["accepted"]),
        "down_model_bytes": mean(lambda r: r["down_model"] / r["accepted"]),
        "down_data_bytes": mean(lambda r: r["down_data"] / r["accepted"]),
        "up_bytes": up,
        "total_bytes": down + up,
        "payload_bytes_per_update": mean(lambda r: r["up_payload"] / r["accepted"]),
        "wire_bytes": mean(lambda r: (r["wire_down"] + r["wire_up"]) / r["accepted"]),
        # steady state, per task
        "steady_down_bytes": mean(lambda r: r["steady_down"]),
        "steady_up_bytes": mean(lambda r: r["steady_up"]),
        "steady_total_bytes": mean(lambda r: r["steady_down"] + r["steady_up"]),
        "data_bytes_per_client": mean(lambda r: r["down_data"]) / args.clients,
        "tasks_per_client": mean(lambda r: r["tasks_per_client"]),
        "tasks_per_client_range": [
            min(r["tasks_per_client_min"] for r in runs),
            max(r["tasks_per_client_max"] for r in runs),
        ],
        "downloads": {k: mean(lambda r, k=k: r["downloads"][k]) for k in runs[0]["downloads"]},
        "accuracy": mean(lambda r: r["accuracy"]),
        "accuracy_runs": [r["accuracy"] for r in runs],
        "loss": mean(lambda r: r["loss"]),
        "mean_staleness": mean(lambda r: r["mean_staleness"]),
        "client_drift": float(np.mean(drifts)) if drifts else None,
    }


def compare(r: dict[str, Any], base: dict[str, Any]) -> None:
    """Ratios against the dense baseline (fp32 up, full fp32 down), in place."""
    r["upload_reduction"] = base["up_bytes"] / r["up_bytes"]
    r["payload_reduction"] = base["payload_bytes_per_update"] / r["payload_bytes_per_update"]
    r["total_reduction"] = base["steady_total_bytes"] / r["steady_total_bytes"]
    r["whole_run_reduction"] = base["total_bytes"] / r["total_bytes"]
    r["accuracy_loss_points"] = 100 * (base["accuracy"] - r["accuracy"])
    # paired by seed: its standard error is what the 0.5-point goal is read against
    diff = 100 * (np.array(base["accuracy_runs"]) - np.array(r["accuracy_runs"]))
    r["accuracy_loss_points_sem"] = (
        float(diff.std(ddof=1) / np.sqrt(diff.size)) if diff.size > 1 else None
    )
    r["loss_increase"] = r["loss"] - base["loss"]
    ok = r["accuracy_loss_points"] <= GOAL_POINTS
    r["meets_goal"] = ok and r["total_reduction"] >= GOAL_X
    r["meets_goal_whole_run"] = ok and r["whole_run_reduction"] >= GOAL_X
    # Whole run at T tasks per client ~ steady + one-time shard data / T, for this
    # row and the baseline alike: the T at which the ratio reaches the goal.
    s, b, o = r["steady_total_bytes"], base["steady_total_bytes"], r["data_bytes_per_client"]
    r["tasks_per_client_for_goal"] = (GOAL_X - 1) * o / (b - GOAL_X * s) if b > GOAL_X * s else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--updates", type=int, default=600, help="accepted updates (versions) per run")
    ap.add_argument("--seeds", type=int, default=6, help="runs per row (figures are averaged)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--tau", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--alpha", type=float, default=0.6, help="FedAsync mixing weight")
    ap.add_argument("--window", default="1", help="FedAsync window: 1 (classic) .. 64, or auto")
    ap.add_argument("--widths", default="64,128,10")
    ap.add_argument(
        "--rows",
        default="upload,delta,extra",
        help="upload: upload codecs, full downloads; delta: --delta codecs at the job "
        "defaults; extra: what it takes (DELTA_EXTRA)",
    )
    ap.add_argument("--delta", default=DELTA_CODECS, help="delta codecs of the delta rows")
    ap.add_argument("--only", help="comma-separated labels (upload codec) to run")
    args = ap.parse_args(argv)
    parts = {p.strip() for p in args.rows.split(",")}
    if not parts <= {"upload", "delta", "extra"}:
        ap.error(f"--rows: unknown {sorted(parts - {'upload', 'delta', 'extra'})}")
    configs: list[Config] = []
    if "upload" in parts:
        configs += UPLOAD_ROWS
    if "delta" in parts:
        configs += delta_rows([d.strip() for d in args.delta.split(",") if d.strip()])
    if "extra" in parts:
        configs += extra_rows()
    if args.only:
        wanted = {s.strip() for s in args.only.split(",")}
        configs = [c for c in configs if c.label in wanted]
    t0 = time.perf_counter()
    # small GEMMs: one BLAS thread (two spin against each other on a busy machine)
    with threadpool_limits(1):
        base = row(BASELINE, args)
        rows = [base if c == BASELINE else row(c, args) for c in configs]
    for r in rows:
        compare(r, base)
    report = {
        "benchmark": "compression",
        "kind": "real coordinator (testkit.loopback), decentral-async fedasync",
        "dataset": "digits",
        "widths": [int(w) for w in args.widths.split(",")],
        "clients": args.clients,
        "tau": args.tau,
        "batch": args.batch,
        "lr": args.lr,
        "alpha": args.alpha,
        "window": args.window,
        "updates": args.updates,
        "seeds": args.seeds,
        "goal": (
            f">= {GOAL_X:g}x fewer bytes per task, down + up, steady state, than fp32 "
            f"uploads with full fp32 downloads, at <= {GOAL_POINTS} accuracy points"
        ),
        "baseline": base["config"] + " / " + base["download"],
        "baseline_row": base,
        "rows": rows,
        "wall_s": time.perf_counter() - t0,
    }
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
        return 0
    print_table(report)
    return 0


def print_table(report: dict[str, Any]) -> None:
    """The table as text: bytes per task (steady state) and per update (whole run)."""
    print(f"{report['kind']}; digits {report['widths']}, {report['clients']} clients, "
          f"tau={report['tau']}, window {report['window']}, {report['updates']} updates, "
          f"mean of {report['seeds']} seeds; goal: {report['goal']}")  # fmt: skip
    print(
        f"{'upload':<22}{'download':<42}{'down B':>8}{'up B':>7}{'total':>8}{'x':>6}"
        f"{'whole':>8}{'x':>6}{'up-only x':>10}{'tasks/cl':>9}{'accuracy':>9}{'pts':>14}"
        f"{'loss':>7}  goal"
    )
    for r in report["rows"]:
        sem = (
            "" if r["accuracy_loss_points_sem"] is None else f"±{r['accuracy_loss_points_sem']:.2f}"
        )
        print(
            f"{r['config']:<22}{r['download']:<42}{r['steady_down_bytes']:>8,.0f}"
            f"{r['steady_up_bytes']:>7,.0f}{r['steady_total_bytes']:>8,.0f}"
            f"{r['total_reduction']:>6.1f}{r['total_bytes']:>8,.0f}{r['whole_run_reduction']:>6.1f}"
            f"{r['upload_reduction']:>10.1f}{r['tasks_per_client']:>9.0f}{r['accuracy']:>9.4f}"
            f"{r['accuracy_loss_points']:>7.2f}{sem:>7}{r['loss']:>7.3f}"
            f"  {'yes' if r['meets_goal'] else ''}"
            f"{' (whole run too)' if r['meets_goal_whole_run'] else ''}"
        )
    print(f"wall {report['wall_s']:.1f} s")


if __name__ == "__main__":
    raise SystemExit(main())
