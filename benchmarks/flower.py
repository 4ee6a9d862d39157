"""Flower and crowdgrad on the same federated job, both from a cold start with real
processes: wall time to 0.95 test accuracy on digits and time per round.

The job (crowdgrad's decentral-sync settings that reach 0.95 in tests/e2e): the
MLP [64, 128, 10] (ReLU, softmax cross-entropy) from crowdgrad's version 0, 8
clients on crowdgrad's 8 iid shards of the digits training split, 4 clients per
round, each 10 SGD steps of batch 16 at lr 0.1, FedAvg (mean weighted by rows
trained), evaluated after every round on the same held-out split (449 rows).

- **crowdgrad**: ``crowdgrad coordinator --job JOB`` and 8 ``crowdgrad client URL``
  processes, all launched at t = 0; the coordinator's ``/api/status`` is polled
  (every 50 ms) for the model version and the last evaluation. The clients
  compute at their default idle priority (``--priority normal``: as Flower's
  actors do, which matters on a machine with other work on it).
- **Flower**: ``benchmarks/flower_app.py`` in Flower's simulation engine
  (``flwr.simulation.run_simulation``: a ServerApp with ``FedAvg``, 8 SuperNodes
  on Ray, one CPU per ClientApp actor), launched at t = 0; the model is numpy,
  so there is no torch in either. It prints the time of each round's evaluation.

Time per round: from the first round's end to the round that reached the target,
divided by the rounds between them (start-up excluded). The runs alternate which
system goes first. crowdgrad's numba kernels come from the on-disk cache (an
untimed run fills it first, as the first run after an install does), and so do
the clients' shards and FLOP/s measurement (a ``CROWDGRAD_CACHE_DIR`` of this
run, filled by the same untimed run: a machine that ran a client before);
Python's bytecode is cached for both (Flower's by pip, crowdgrad's under a
``PYTHONPYCACHEPREFIX`` of this run).

Flower runs in its own venv: ``flwr[simulation]`` pins ray (2.55.1 for flwr
1.42.0) and older fastapi, uvicorn, rich and protobuf than the project's, so
installing it beside crowdgrad would downgrade them. The benchmark makes that
venv once under ``$XDG_CACHE_HOME/crowdgrad/bench/`` (``python -m venv``, then
``pip install flwr[simulation]==1.42.0 numpy``) or uses ``--flower-python``.

    .venv/bin/python benchmarks/flower.py [--runs 3] [--json] [--flower-python PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, this file's folder is sys.path[0] and would shadow the
# ``protocol`` package with benchmarks/protocol.py.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import numpy as np  # noqa: E402

from coordinator.core.config import JobConfig, parse_job  # noqa: E402
from coordinator.core.data import load_job_data  # noqa: E402
from nn.data import shard  # noqa: E402

ROOT = _HERE.parent
FLWR = "flwr[simulation]==1.42.0"
CLIENTS = 8
TARGET = 0.95
#: decentral-sync as tests/e2e/e2e_helpers.py SETTINGS runs it, on the default model
JOB = {
    "model": {"widths": [64, 128, 10]},
    "data": {"dataset": "digits", "shards": CLIENTS, "batch": 16},
    "strategy": {"name": "decentral-sync", "tau": 10, "lr": 0.1, "clients_per_round": 4},
    "eval": {"every_versions": 1},
    "stop": {"target_accuracy": TARGET, "max_versions": 2000},
}


def job_toml(job: dict) -> str:
    """``job`` as a TOML job file (tables of numbers, strings and lists)."""
    lines = []
    for section, fields in job.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in fields.items()]
        lines.append("")
    return "\n".join(lines)


def flower_python(explicit: str | None) -> str:
    """Flower's interpreter: ``explicit``, else a venv made once under the cache dir."""
    if explicit:
        return explicit
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    venv = base / "crowdgrad" / "bench" / FLWR.replace("[simulation]==", "-")
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"making Flower's venv in {venv} ({FLWR})", file=sys.stderr)
        subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", FLWR, "numpy"], check=True)
    return str(python)


def write_flower_data(job: JobConfig, path: Path) -> None:
    """crowdgrad's job as arrays for flower_app.py: each shard's rows, the held-out
    split, version 0's weights and the hyperparameters."""
    ds = load_job_data(job)
    parts = shard(ds.y_train, job.data.shards, kind=job.data.sharding, seed=job.data.seed)
    params = job.spec.init_params(job.model.init_seed)
    arrays: dict[str, np.ndarray] = {"X_test": ds.X_test, "y_test": ds.y_test}
    for i, idx in enumerate(parts):
        arrays[f"X{i}"], arrays[f"y{i}"] = ds.X_train[idx], ds.y_train[idx]
    for k, (W, b) in enumerate(params.layers):
        arrays[f"w{2 * k}"], arrays[f"w{2 * k + 1}"] = W.copy(), b.copy()
    s = job.strategy
    assert s.clients_per_round is not None
    np.savez(
        path,
        **arrays,
        clients=CLIENTS,
        clients_per_round=s.clients_per_round,
        tau=s.tau,
        batch=job.data.batch,
        lr=s.lr,
    )


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, by parent id from /proc (Ray's daemons and
    actors; once their parent dies they are orphaned and can no longer be found)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """End ``proc`` and every process it started, by their ids."""
    for pid in [*descendants(proc.pid), proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(30)


def run_flower(python: str, data: Path, timeout: float) -> dict:
    """One Flower simulation from launch to the target: seconds since launch."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [python, str(_HERE / "flower_app.py"), str(data), "--target", str(TARGET)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        env={**os.environ, "RAY_DEDUP_LOGS": "0"},
    )
    evals: list[tuple[int, float, float]] = []
    reached = False
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("FLOWER-EVAL"):
                _, rnd, acc, t = line.split()
                evals.append((int(rnd), float(acc), float(t) - t0))
            elif line.startswith("FLOWER-TARGET"):
                reached = True
                break
            if time.monotonic() - t0 > timeout:
                break
    finally:
        kill_tree(proc)
    if not reached:
        raise RuntimeError(f"Flower did not reach {TARGET} ({len(evals)} evaluations)")
    return summarise_run(evals)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def poll_status(port: int) -> dict | None:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0)
        conn.request("GET", "/api/status")
        body = conn.getresponse().read()
        conn.close()
        return json.loads(body)
    except (OSError, ValueError, http.client.HTTPException):
        return None


def run_crowdgrad(
    job_file: Path, env: dict[str, str], timeout: float, priority: str = "idle"
) -> dict:
    """One coordinator and 8 client processes from launch to the target."""
    port = free_port()
    url = f"ws://127.0.0.1:{port}/ws"
    cmd = [sys.executable, "-m", "crowdgrad"]
    out = subprocess.DEVNULL
    t0 = time.monotonic()
    coord = subprocess.Popen(  # kept running: its status holds the last evaluation
        # --no-store: as measured before runs persisted by default (no durable acks)
        [
            *cmd,
            "coordinator",
            "--job",
            str(job_file),
            "--port",
            str(port),
            "--keep-running",
            "--no-store",
        ],
        cwd=ROOT,
        env=env,
        stdout=out,
        stderr=out,
    )
    clients = [
        subprocess.Popen(
            [*cmd, "client", url, "-q", "--name", f"c{i}", "--priority", priority],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=out,
        )
        for i in range(CLIENTS)
    ]
    evals: list[tuple[int, float, float]] = []
    reached = False
    try:
        while True:
            st = poll_status(port)
            now = time.monotonic() - t0
            last = st.get("last_evaluation") if st else None
            if last and (not evals or evals[-1][0] != last["version"]):
                evals.append((int(last["version"]), float(last["accuracy"]), now))
            if last and last["accuracy"] >= TARGET:
                reached = True
                break
            if (st and st.get("finished")) or coord.poll() is not None or now > timeout:
                raise RuntimeError(f"crowdgrad did not reach {TARGET}: {st and st.get('finished')}")
            time.sleep(0.05)
    finally:
        for p in clients:  # the job's end says bye to them: they exit on their own
            try:
                p.wait(10 if reached else 0.01)
            except subprocess.TimeoutExpired:
                kill_tree(p)
        coord.terminate()  # a graceful stop
        try:
            coord.wait(30)
        except subprocess.TimeoutExpired:
            kill_tree(coord)
    return summarise_run(evals)


def summarise_run(evals: list[tuple[int, float, float]]) -> dict:
    """``evals``: (round or version, accuracy, seconds since launch), the last at
    the target."""
    last_round, acc, t_target = evals[-1]
    first = next((e for e in evals if e[0] >= 1), evals[-1])
    rounds_between = last_round - first[0]
    per_round = (t_target - first[2]) / rounds_between if rounds_between > 0 else None
    return {
        "to_target_s": t_target,
        "rounds": last_round,
        "accuracy": acc,
        "first_round_s": first[2],
        "per_round_s": per_round,
    }


def summary(runs: list[dict]) -> dict:
    def med(key: str) -> float | None:
        vals = [r[key] for r in runs if r[key] is not None]
        return statistics.median(vals) if vals else None

    return {
        "runs": runs,
        "to_target_s": med("to_target_s"),
        "to_target_min_max_s": [
            min(r["to_target_s"] for r in runs),
            max(r["to_target_s"] for r in runs),
        ],
        "rounds": med("rounds"),
        "first_round_s": med("first_round_s"),
        "per_round_s": med("per_round_s"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs of each system (medians shown)")
    ap.add_argument("--flower-python", help="an interpreter with flwr[simulation] (default: made)")
    ap.add_argument("--timeout", type=float, default=600.0, help="per run, seconds")
    ap.add_argument(
        "--priority",
        choices=("idle", "normal"),
        default="idle",
        help="the crowdgrad clients' compute priority (default idle, the client's own: "
        "it yields to every other process on the machine, Flower's actors do not)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    python = flower_python(args.flower_python)
    job = parse_job(JOB)
    with tempfile.TemporaryDirectory(prefix="crowdgrad-flower-") as tmp:
        job_file, data = Path(tmp, "job.toml"), Path(tmp, "digits.npz")
        job_file.write_text(job_toml(JOB))
        write_flower_data(job, data)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp, "pycache"))
        # the clients' cache folder (shards, the FLOP/s measurement) of this run only
        env["CROWDGRAD_CACHE_DIR"] = str(Path(tmp, "client-cache"))
        load_start = os.getloadavg()
        # untimed: fills numba's, Python's and the clients' caches
        run_crowdgrad(job_file, env, args.timeout, args.priority)
        results: dict[str, list[dict]] = {"crowdgrad": [], "flower": []}
        for i in range(args.runs):
            order = ("crowdgrad", "flower") if i % 2 == 0 else ("flower", "crowdgrad")
            for system in order:
                if system == "crowdgrad":
                    run = run_crowdgrad(job_file, env, args.timeout, args.priority)
                    results[system].append(run)
                else:
                    results[system].append(run_flower(python, data, args.timeout))
        load_end = os.getloadavg()
    cg, fl = summary(results["crowdgrad"]), summary(results["flower"])
    ratio = {
        "to_target": fl["to_target_s"] / cg["to_target_s"],
        "per_round": (
            fl["per_round_s"] / cg["per_round_s"]
            if fl["per_round_s"] and cg["per_round_s"]
            else None
        ),
    }
    out = {
        "job": JOB,
        "flower": FLWR,
        "client_priority": args.priority,
        "load_average": {"start": list(load_start), "end": list(load_end)},
        "crowdgrad": cg,
        "flower_sim": fl,
        "flower_over_crowdgrad": ratio,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"digits to {TARGET}, {CLIENTS} clients, medians of {args.runs}; load average "
          f"{load_start[0]:.2f} -> {load_end[0]:.2f}")  # fmt: skip
    for name, s in (("crowdgrad", cg), ("Flower", fl)):
        lo, hi = s["to_target_min_max_s"]
        per = "n/a" if s["per_round_s"] is None else f"{s['per_round_s'] * 1000:.1f} ms"
        print(
            f"{name:<10} to target {s['to_target_s']:.2f} s ({lo:.2f}-{hi:.2f}), "
            f"{s['rounds']:.0f} rounds, first round at {s['first_round_s']:.2f} s, {per}/round"
        )
    per_ratio = "n/a" if ratio["per_round"] is None else f"{ratio['per_round']:.1f}x"
    print(f"Flower / crowdgrad: to target {ratio['to_target']:.2f}x, per round {per_ratio}")


if __name__ == "__main__":
    main()
