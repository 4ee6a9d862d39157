"""Honest replicas across implementations: do conforming clients ever get excluded?

Replication (coordinator/core/replication.py, judging.py) compares two clients' results of one
task with ``agree`` at the job's tolerances; on a disagreement the coordinator's
own run (``client.compute.run_task``) judges each copy with what can prove it
(``judge``: by the copies' kernel families, ``hello.kernel``), and a client proven
wrong ``strikes`` times among its last ``strike_window`` checked results is
excluded. This computes the same tasks with the three implementations a crowd
holds, all conforming to docs/protocol.md §12:

- ``python``: the desktop client (numba kernels, float32 BLAS sums; ``numba-f32``),
  also the coordinator's own run;
- ``js``: the browser client's plain JavaScript kernels (float64 sums; ``js-f64``);
- ``wasm``: its WebAssembly SIMD kernels (float32 sums, another order;
  ``wasm-simd-f32``),

the last two under node (client/web/bench/pairs.mjs, the worker's code). Every pair
of every task is compared with ``agree`` (the raw figures), then a crowd is run
through the coordinator's own functions (``agree``, ``judge``, ``shift_check``)
under each pairing of ``PAIRINGS``: twins of the primary holder's family (what
``Replicator.twin_for`` gives while such a client is idle) and twins of another
family (its ``twin_wait_s`` fallback). The crowd holds an honest client of each
implementation, primaries going to each in turn, and for each of the seven lies of
simulations/attacks.py a liar claiming each family, planted on every
``--lie-every``-th task with an honest twin. Within a family results are taken
to be bit-exact (§12.8: the JS and WASM kernel sets each are), so two honest
copies of one family are one array. Tasks are of the job's kind: its model, its
shards as the coordinator cuts them, model versions along a training run, seeds,
steps, the linear lr scaling's lrs and every §12.5 optimizer.

    .venv/bin/python benchmarks/replicas.py [--workload digits] [--tasks 100000] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import msgpack  # noqa: E402
import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from client.compute import run_task  # noqa: E402
from coordinator.core.config import JobConfig, parse_job  # noqa: E402
from coordinator.core.data import DataCatalog, load_job_data  # noqa: E402
from coordinator.core.judging import Verdict, agree, judge, shift_check  # noqa: E402
from nn.optim import Optimizer, OptState  # noqa: E402
from nn.params import Params  # noqa: E402
from nn.rng import Xoshiro128ss  # noqa: E402
from nn.train import train_steps  # noqa: E402
from protocol import messages as m  # noqa: E402
from protocol.shardfile import ShardData, decode_shard  # noqa: E402
from simulations.attacks import Attacker, AttackSpec  # noqa: E402

WEB = Path(__file__).resolve().parents[1] / "client" / "web"
IMPLS = ("python", "js", "wasm")
PAIRS = (("python", "js"), ("python", "wasm"), ("js", "wasm"))
#: lies a replica can catch (``hijack`` is refused by the lease, not by replication)
LIES = ("sign_flip", "scaled", "noise", "label_flip", "alie", "free_rider", "stale")

#: workload -> (job tables, training steps of the model versions, task steps lo..hi)
WORKLOADS: dict[str, tuple[dict[str, Any], list[int], tuple[int, int]]] = {
    # the default job: one pass over a 168-row shard at batch 16 is ~10 steps
    "digits": ({}, [0, 20, 100, 400, 1500, 5000], (5, 21)),
    # benchmarks/crowd.py's generated job: tau auto gives hundreds of steps
    "generated": (
        {"model": {"widths": [64, 256, 256, 10]}, "data": {"dataset": "classify:200000"}},
        [0, 100, 500, 2000],
        (50, 400),
    ),
}


def versions(job: JobConfig, X: np.ndarray, y: np.ndarray, marks: list[int]) -> list[Params]:
    """The model at each of ``marks`` training steps of the job's own optimizer."""
    params = job.spec.init_params(job.model.init_seed)
    opt = Optimizer(kind=job.strategy.client_optimizer, lr=job.strategy.lr)
    state = OptState.init(opt, job.spec)
    rng = Xoshiro128ss(job.data.seed, 0)
    out, done = [], 0
    for mark in marks:
        if mark > done:
            train_steps(params, state, X, y, mark - done, job.data.batch, rng)
            done = mark
        out.append(params.copy())
    return out


def draw_task(job: JobConfig, i: int, rng: np.random.Generator, n_versions: int,
              catalog: DataCatalog, steps: tuple[int, int]) -> tuple[m.Task, int, int]:  # fmt: skip
    """A task as the coordinator leases one: a version, a shard, a seed, steps, and
    the job's lr times the linear scaling's 1..4 (mostly its own optimizer)."""
    version = int(rng.integers(n_versions))
    shard = int(rng.integers(len(catalog.shards)))
    lr = job.strategy.lr * float(rng.uniform(1, job.strategy.lr_scale_max))
    kind = rng.choice(["own", "momentum", "nesterov", "adam"], p=[0.7, 0.1, 0.1, 0.1])
    if kind == "own":
        opt = Optimizer(kind=job.strategy.client_optimizer, lr=lr)
    elif kind == "adam":
        opt = Optimizer(kind="adam", lr=lr / 50)
    else:
        opt = Optimizer(kind="momentum", lr=lr / 5, nesterov=kind == "nesterov")
    task = m.Task(
        task_id=str(i), model_version=version, spec=job.spec, dataset="replicas",
        base_version=version, data=catalog.shards[shard].sha256, kind="train",
        steps=int(rng.integers(*steps)), batch=job.data.batch,
        seed=int(rng.integers(2**63)), optimizer=opt.to_dict(),
    )  # fmt: skip
    return task, version, shard


def node_batch(
    job: JobConfig,
    models: list[Params],
    shards: list[ShardData],
    items: list[tuple[m.Task, int, int]],
    folder: Path,
    k: int,
) -> subprocess.Popen:
    """Starts node on one batch of tasks; its output is ``folder/out{k}.msgpack``."""
    doc = {
        "spec": job.spec.to_dict(),
        "models": [p.data.astype("<f4").tobytes() for p in models],
        "shards": [
            {
                "X": s.X.astype("<f4").tobytes(),
                "y": s.y.astype("<i4").tobytes(),
                "n": s.rows,
                "f": int(s.X.shape[1]),
            }
            for s in shards
        ],
        "tasks": [
            {
                "model": v,
                "shard": s,
                "task": {
                    "kind": t.kind,
                    "steps": t.steps,
                    "batch": t.batch,
                    "seed": t.seed,
                    "optimizer": t.optimizer,
                },
            }
            for t, v, s in items
        ],
    }
    src, out = folder / f"in{k}.msgpack", folder / f"out{k}.msgpack"
    src.write_bytes(msgpack.packb(doc, use_bin_type=True))
    return subprocess.Popen(["node", "bench/pairs.mjs", str(src), str(out)], cwd=WEB)


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    longer = max(float(np.linalg.norm(a64)), float(np.linalg.norm(b64)))
    return float(np.linalg.norm(a64 - b64)) / longer if longer else 0.0


#: each implementation's §12 kernel family (hello.kernel, protocol.messages.KERNELS)
FAMILY = {"python": "numba-f32", "js": "js-f64", "wasm": "wasm-simd-f32"}
#: how twins are given: to a client of the primary holder's family (what
#: ``Replicator.twin_for`` does while one is idle within ``twin_wait_s``), or, the
#: fallback (``may_take`` after ``twin_wait_s``), to a client of another family
PAIRINGS = ("same-kernel", "cross-kernel")


class Crowd:
    """One pairing's crowd under the coordinator's rule: an honest client of each
    implementation, and for each lie a liar claiming each family (it says its
    kernel in hello like anyone). Every verdict comes from
    ``coordinator.core.judging`` (``agree``, ``judge``, ``shift_check``)."""

    def __init__(self, pairing: str, rule: dict[str, float], strikes: int, window: int) -> None:
        self.pairing, self.rule, self.strikes, self.window = pairing, rule, strikes, window
        self.honest = {impl: {"checked": 0, "disagreed": 0, "struck": 0, "inconclusive": 0,
                              "exclusions": 0} for impl in IMPLS}  # fmt: skip
        self._bits: dict[Any, int] = {}
        self.struck: list[dict[str, Any]] = []
        #: honest copies proven wrong in a pair with a liar (of one family: the liar nearer)
        self.honest_struck_beside_liars = 0
        self.lies = {kind: {impl: {"planted": 0, "struck": 0, "inconclusive": 0,
                                   "excluded_after": None} for impl in IMPLS}
                     for kind in LIES}  # fmt: skip

    def partner(self, impl: str, i: int) -> str:
        """The implementation that computes the twin of ``impl``'s task ``i``."""
        if self.pairing == "same-kernel":
            return impl
        others = [o for o in IMPLS if o != impl]
        return others[i % 2]

    def _verdicts(self, a: str, b: str, ua: np.ndarray, ub: np.ndarray,
                  own: np.ndarray) -> tuple[Verdict, Verdict] | None:  # fmt: skip
        """None: the copies agree; else the coordinator's verdicts (a, b)."""
        if agree(ua, ub, **self.rule):
            return None
        return judge(ua, ub, own, kernels=(FAMILY[a], FAMILY[b]), **self.rule)

    def _check(self, who: Any, verdict: Verdict) -> bool:
        """One checked result into ``who``'s window; True: this excludes it (and it
        starts over as a fresh client). An inconclusive copy is no check."""
        if verdict is Verdict.INCONCLUSIVE:
            return False
        bits = shift_check(self._bits.get(who, 0), verdict is Verdict.WRONG, self.window)
        if bits.bit_count() >= self.strikes:
            self._bits[who] = 0
            return True
        self._bits[who] = bits
        return False

    def honest_pair(self, task: m.Task, i: int, ups: dict[str, np.ndarray]) -> None:
        """Task ``i``'s primary goes to one implementation (in turn), its twin as the
        pairing gives it; both honest."""
        a = IMPLS[i % len(IMPLS)]
        b = self.partner(a, i // len(IMPLS))
        verdicts = self._verdicts(a, b, ups[a], ups[b], ups["python"])
        for impl, v in ((a, verdicts[0] if verdicts else Verdict.RIGHT),
                        (b, verdicts[1] if verdicts else Verdict.RIGHT)):  # fmt: skip
            row = self.honest[impl]
            row["checked"] += 1
            row["disagreed"] += verdicts is not None
            row["struck"] += v is Verdict.WRONG
            row["inconclusive"] += v is Verdict.INCONCLUSIVE
            if v is Verdict.WRONG:
                self.struck.append({"task": task.task_id, "impl": impl, "pair": f"{a}-{b}",
                                    "distance": rel_l2(ups[impl], ups["python"])})  # fmt: skip
            if self._check(("honest", impl), v):
                row["exclusions"] += 1
            if a == b:
                break  # two clients of one family: the same copy, one check counted

    def liar_pair(self, kind: str, lie: np.ndarray, i: int, ups: dict[str, np.ndarray]) -> None:
        """A liar of each claimed family uploads ``lie``; its twin is honest."""
        for claim in IMPLS:
            row = self.lies[kind][claim]
            row["planted"] += 1
            other = self.partner(claim, i)
            verdicts = self._verdicts(claim, other, lie, ups[other], ups["python"])
            v = verdicts[0] if verdicts else Verdict.RIGHT
            row["struck"] += v is Verdict.WRONG
            row["inconclusive"] += v is Verdict.INCONCLUSIVE
            if verdicts is not None and verdicts[1] is Verdict.WRONG:
                self.honest_struck_beside_liars += 1
            if self._check(("liar", kind, claim), v) and row["excluded_after"] is None:
                row["excluded_after"] = row["planted"]

    def report(self) -> dict[str, Any]:
        exclusions = {impl: row["exclusions"] for impl, row in self.honest.items()}
        return {
            "honest": self.honest,
            "strikes": {impl: row["struck"] for impl, row in self.honest.items()},
            "exclusions": exclusions,
            "honest_exclusions": sum(exclusions.values()),
            "honest_struck_beside_liars": self.honest_struck_beside_liars,
            "struck": self.struck[:50],
            "lies": {
                kind: {
                    claim: {**row, "excluded": row["excluded_after"] is not None}
                    for claim, row in by_claim.items()
                }
                for kind, by_claim in self.lies.items()
            },
            "lies_excluded": {
                kind: [claim for claim, row in by_claim.items() if row["excluded_after"]]
                for kind, by_claim in self.lies.items()
            },
        }


class Tally:
    """Pairs of implementations compared (every pair of every task, raw), and each
    pairing's crowd under the coordinator's rule (``Crowd``)."""

    def __init__(self, job: JobConfig) -> None:
        r = job.replication
        self.rule = {"rtol": r.slack * r.rtol, "atol": r.slack * r.atol, "distance": r.distance}
        self.strict = {**self.rule, "distance": 0.0}
        self.strikes_to_exclude, self.window = r.strikes, r.strike_window
        self.pairs = {f"{a}-{b}": {"compared": 0, "disagreed": 0, "outside_values": 0,
                                   "inconclusive": 0, "max_distance": 0.0}
                      for a, b in PAIRS}  # fmt: skip
        self.crowds = {p: Crowd(p, self.rule, r.strikes, r.strike_window) for p in PAIRINGS}
        self.max_loss_rel = 0.0
        self.lies = {kind: {"planted": 0, "caught": 0, "min_distance": math.inf}
                     for kind in LIES}  # fmt: skip
        self._n = 0

    def add(self, task: m.Task, ups: dict[str, np.ndarray], losses: dict[str, float],
            lies: dict[str, np.ndarray] | None = None) -> None:  # fmt: skip
        """One task's three honest updates (``python`` is also the coordinator's own
        run) and the lies planted on it (kind -> update)."""
        own = ups["python"]
        for a, b in PAIRS:
            row = self.pairs[f"{a}-{b}"]
            row["compared"] += 1
            row["max_distance"] = max(row["max_distance"], rel_l2(ups[a], ups[b]))
            if not agree(ups[a], ups[b], **self.strict):
                row["outside_values"] += 1
            if agree(ups[a], ups[b], **self.rule):
                continue
            row["disagreed"] += 1
            verdicts = judge(ups[a], ups[b], own, kernels=(FAMILY[a], FAMILY[b]), **self.rule)
            row["inconclusive"] += verdicts.count(Verdict.INCONCLUSIVE)
        for crowd in self.crowds.values():
            crowd.honest_pair(task, self._n, ups)
        for kind, lie in (lies or {}).items():
            row = self.lies[kind]
            row["planted"] += 1
            if not np.array_equal(lie, own):  # a stale liar's first upload is honest
                row["min_distance"] = min(row["min_distance"], rel_l2(lie, own))
            row["caught"] += not agree(lie, own, **self.rule)
            for crowd in self.crowds.values():
                crowd.liar_pair(kind, lie, row["planted"], ups)
        for impl in ("js", "wasm"):
            want = losses["python"]
            if want:
                self.max_loss_rel = max(self.max_loss_rel, abs(losses[impl] - want) / abs(want))
        self._n += 1

    def report(self) -> dict[str, Any]:
        pairings = {p: c.report() for p, c in self.crowds.items()}
        return {
            "rule": self.rule,
            "strikes_to_exclude": self.strikes_to_exclude,
            "strike_window": self.window,
            "pairs": self.pairs,
            "pairings": pairings,
            "honest_exclusions": sum(p["honest_exclusions"] for p in pairings.values()),
            "max_loss_rel": self.max_loss_rel,
            "lies": {
                k: {
                    **v,
                    "min_distance": v["min_distance"] if v["min_distance"] < math.inf else None,
                }
                for k, v in self.lies.items()
            },
        }


def run(workload: str, tasks: int, batch: int, lie_every: int, seed: int) -> dict[str, Any]:
    tables, marks, steps = WORKLOADS[workload]
    job = parse_job(tables, source=workload)
    dataset = load_job_data(job)
    catalog = DataCatalog.for_job(job, dataset)
    shards = [decode_shard(s.blob) for s in catalog.shards]
    models = versions(job, dataset.X_train, dataset.y_train, marks)
    rng = np.random.default_rng(seed)
    tally = Tally(job)
    liars = {kind: Attacker(AttackSpec(kind=kind, fraction=1.0), np.random.default_rng(seed))
             for kind in LIES}  # fmt: skip
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for k, start in enumerate(range(0, tasks, batch)):
            items = [draw_task(job, i, rng, len(models), catalog, steps)
                     for i in range(start, min(tasks, start + batch))]  # fmt: skip
            node = node_batch(job, models, shards, items, folder, k)
            mine, planted = [], []
            for task, v, s in items:
                out = run_task(task, models[v], shards[s])
                mine.append((out.update, out.loss))
                lies = {}
                if int(task.task_id) % lie_every == 0:
                    for kind, liar in liars.items():
                        lies[kind] = liar.compute(task, models[v], shards[s]).update
                planted.append(lies)
            if node.wait() != 0:
                raise SystemExit(f"node failed on batch {k} (exit {node.returncode})")
            got = msgpack.unpackb((folder / f"out{k}.msgpack").read_bytes(), raw=False)
            names = {"js": 0, "wasm-simd": 1}
            if sorted(got["kernels"]) != sorted(names):
                raise SystemExit(f"node ran kernels {got['kernels']}, expected {sorted(names)}")
            for j, (task, _, _) in enumerate(items):
                ups = {"python": mine[j][0]}
                losses = {"python": mine[j][1]}
                for impl, name in (("js", "js"), ("wasm", "wasm-simd")):
                    col = got["kernels"].index(name)
                    ups[impl] = np.frombuffer(got["updates"][j][col], "<f4")
                    losses[impl] = got["losses"][j][col]
                tally.add(task, ups, losses, planted[j])
            (folder / f"in{k}.msgpack").unlink()
            (folder / f"out{k}.msgpack").unlink()
            print(f"  {min(tasks, start + batch):>7} tasks, {time.perf_counter() - t0:6.0f} s",
                  file=sys.stderr)  # fmt: skip
    return {
        "workload": workload,
        "tasks": tasks,
        "params": job.spec.num_params,
        "steps": list(steps),
        "versions_at_steps": marks,
        "lie_every": lie_every,
        "seed": seed,
        "wall_s": round(time.perf_counter() - t0, 1),
        **tally.report(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="digits")
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=2000, help="tasks per node call")
    ap.add_argument("--lie-every", type=int, default=10, help="plant each lie on every Nth task")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    for name in ("tasks", "batch", "lie_every"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    r = run(args.workload, args.tasks, args.batch, args.lie_every, args.seed)
    if args.json:
        print(json.dumps(r, indent=2))
        return
    con = Console()
    table = Table(
        title=f"{r['tasks']:,} {r['workload']} tasks, each pair under the coordinator's rule"
    )
    for col in ("pair", "compared", "outside §12.8 values", "disagreed", "max rel L2"):
        table.add_column(col, justify="right")
    for name, row in r["pairs"].items():
        table.add_row(name, f"{row['compared']:,}", f"{row['outside_values']:,}",
                      f"{row['disagreed']:,}", f"{row['max_distance']:.2e}")  # fmt: skip
    con.print(table)
    con.print(f"max loss difference {r['max_loss_rel']:.1e} relative; exclusion at "
              f"{r['strikes_to_exclude']} strikes in {r['strike_window']} checked")  # fmt: skip
    for pairing, p in r["pairings"].items():
        honest = Table(title=f"{pairing} twins: honest clients")
        cols = ("checked", "disagreed", "struck", "inconclusive", "exclusions")
        for col in ("client", *cols):
            honest.add_column(col, justify="right")
        for impl, row in p["honest"].items():
            honest.add_row(impl, *(f"{row[k]:,}" for k in cols))
        con.print(honest)
        con.print(f"honest copies struck in a pair with a liar: "
                  f"{p['honest_struck_beside_liars']}")  # fmt: skip
        lies = Table(title=f"{pairing} twins: liars (on every {r['lie_every']}th task), "
                     "excluded after (planted) by the family each claims")  # fmt: skip
        lies.add_column("lie")
        for impl in IMPLS:
            lies.add_column(FAMILY[impl], justify="right")
        lies.add_column("closest (rel L2)", justify="right")
        for kind, by_claim in p["lies"].items():
            lies.add_row(kind, *(str(by_claim[i]["excluded_after"]) for i in IMPLS),
                         f"{r['lies'][kind]['min_distance']:.3g}")  # fmt: skip
        con.print(lies)
    if not math.isfinite(r["max_loss_rel"]):
        raise SystemExit("a loss was not finite")


if __name__ == "__main__":
    main()
