"""The crowd against the machine: real processes, time to accuracy.

For each workload a job file is written; the anchor is ``crowdgrad train --job``
on it (the one machine at its best: the fastest thread count and, with
``--grid``, the best optimizer and lr of a short trial each, then the budget
with the job's lr-on-plateau schedule and at a constant lr, the higher kept);
each crowd is a ``crowdgrad coordinator --job`` process and N ``crowdgrad
client`` processes on loopback. Both are measured the same way: held-out accuracy over wall-clock
seconds, the anchor from its first training step, the crowd from the launch of
its clients (their start-up, joins and shard downloads count against it;
each run's clients start with empty cache folders). Both start warm: the
anchor trains a step before its clock, and an untimed crowd of one runs before
the timed ones so that numba's cache holds the kernels (``--cold`` skips it).

Reported per row: seconds to 0.85 and to the anchor's accuracy at the budget
(``--seconds``, 60 by default; the mean of its last tenth), the ratio anchor
time / crowd time for that accuracy (above 1: the crowd is faster), best and
final accuracy, results/s, bytes per task and per volunteer-hour (both
directions), and how a job that ended early ended (``converged``: the held-out
loss stopped improving and the model went back to its best; rates are then of
the time it trained, ``bytes_per_volunteer`` is the whole run's), and with
``--json`` the held-out accuracy curve behind the row. ``--out F`` also writes
the results to F after every row, so a run cut short (a lent machine's time
limit) keeps what it measured. Rows run with the job's defaults unless marked
tuned (``--tuned``, ``--tuned-toml``; ``--tuned-clients`` their crowd sizes).

    .venv/bin/python benchmarks/crowd.py [--workload generated] [--clients 1,2] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from crowdgrad.anchor import settled_accuracy, time_to  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CROWDGRAD = [sys.executable, "-m", "crowdgrad"]

#: the generated classification job (nn.data.classification_task), by its row count
GENERATED = """
[model]
widths = [64, 256, 256, 10]
[data]
dataset = "classify:{rows}"
[eval]
max_samples = 5000
"""

#: the workloads: the job file's tables, as TOML text (data written beside it)
WORKLOADS: dict[str, str] = {
    "digits": """
[model]
widths = [64, 128, 10]
[data]
dataset = "digits"
""",
    "generated": GENERATED.format(rows=200_000),
    # the same problem with five times the rows: 60 s of one core is under 8
    # passes, so the one machine does not reach its ceiling (200,000 rows
    # overfit within the budget, and every run there ends near 0.92)
    "generated-1m": GENERATED.format(rows=1_000_000),
    "csv": """
[model]
widths = [64, 128, 10]
[data]
path = "rows.csv"
label = "label"
[eval]
max_samples = 5000
""",
}

#: tuned rows: the job's tables overridden (the best setting measured so far)
TUNED: dict[str, str] = {
    "generated": '[strategy]\nlr = 0.1\nlr_scaling = "none"\n',
}


def write_csv(path: Path, rows: int = 40_000) -> None:
    """A CSV workload: the generated problem's first rows, a ``label`` column."""
    from nn.data import classification_task

    ds = classification_task(rows - 5000, test_rows=5000, seed=0)
    X = np.concatenate([ds.X_train, ds.X_test])
    y = np.concatenate([ds.y_train, ds.y_test])
    header = ",".join([f"x{i}" for i in range(X.shape[1])] + ["label"])
    body = np.column_stack([X, y]).astype(np.float32)
    fmt = ["%.5g"] * X.shape[1] + ["%d"]
    np.savetxt(path, body, delimiter=",", header=header, comments="", fmt=fmt)


def job_file(folder: Path, workload: str, tuned: bool) -> Path:
    text = WORKLOADS[workload]
    if tuned:
        text += TUNED.get(workload, "")
    if workload == "csv" and not (folder / "rows.csv").exists():
        write_csv(folder / "rows.csv")
    path = folder / f"{workload}{'-tuned' if tuned else ''}.toml"
    path.write_text(text)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def stop(proc: subprocess.Popen, grace: float = 15.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def anchor(job: Path, seconds: float, grid: bool, out: Path) -> dict:
    cmd = [*CROWDGRAD, "train", "--job", str(job), "--seconds", str(seconds), "--json", str(out)]
    if grid:
        cmd += ["--grid", "--grid-seconds", str(max(2.0, seconds / 6))]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    best = json.loads(out.read_text())["best"]
    curve = [(p["t"], p["accuracy"]) for p in best["history"]]
    return {
        "curve": curve,
        "optimizer": best["optimizer"],
        "threads": best["threads"],
        "schedule": "lr on plateau" if best.get("plateau") else "constant lr",
    }


ENV = {**os.environ, "CROWDGRAD_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def start_coordinator(job: Path, folder: Path, tag: str) -> tuple[subprocess.Popen, str, Any]:
    """A coordinator on a free port, up and answering; its process, URL base and log."""
    port = free_port()
    log = (folder / f"coordinator-{tag}.log").open("w")
    coord = subprocess.Popen(
        # --no-store: as measured before runs persisted by default (no durable acks)
        [
            *CROWDGRAD,
            "coordinator",
            "--job",
            str(job),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-store",
            "--keep-running",  # a job that converged is read after its end
        ],
        cwd=ROOT,
        env=ENV,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        with contextlib.suppress(OSError):
            get_json(f"{base}/api/status")
            return coord, base, log
        if coord.poll() is not None or time.monotonic() > deadline:
            stop(coord)
            log.close()
            raise RuntimeError(f"coordinator did not start: see {log.name}")
        time.sleep(0.2)


def start_client(base: str, i: int, folder: Path) -> subprocess.Popen:
    url = base.replace("http://", "ws://") + "/ws"
    return subprocess.Popen(
        [
            *CROWDGRAD,
            "client",
            url,
            "-q",
            "--name",
            f"c{i}",
            "--cache-dir",
            str(folder / f"cache-{i}"),
        ],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def warm_up(job: Path, folder: Path, results: int = 5, timeout: float = 60.0) -> None:
    """An untimed crowd of one until a few results are accepted: numba compiles the
    client's and coordinator's kernels into its cache here, not in the first timed
    run (the anchor is timed warm too: it trains a step before its clock starts).
    Each timed client still starts with an empty ``--cache-dir`` (its FLOP/s probe
    and its shard download count)."""
    coord, base, log = start_coordinator(job, folder, "warm-up")
    client = start_client(base, 0, folder / "warm-up")
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if get_json(f"{base}/api/status")["accepted_results"] >= results:
                return
            time.sleep(0.2)
        raise RuntimeError(f"warm-up: fewer than {results} results in {timeout:g} s")
    finally:
        stop(client)
        stop(coord)
        log.close()


def crowd(job: Path, clients: int, seconds: float, folder: Path) -> dict:
    coord, base, log = start_coordinator(job, folder, str(clients))
    procs: list[subprocess.Popen] = []
    try:
        t0 = time.time()
        # every run's clients start with empty cache folders: shard downloads count
        caches = folder / f"caches-{job.stem}-{clients}"
        procs = [start_client(base, i, caches) for i in range(clients)]
        time.sleep(max(0.0, t0 + seconds - time.time()))
        hist = get_json(f"{base}/api/history")
        status = get_json(f"{base}/api/status")
        read_at = time.time() - t0
        joins = join_times(get_json(f"{base}/api/dashboard"), t0)
    finally:
        for p in procs:
            stop(p)
        stop(coord)
        log.close()
    curve = [(e[0] - t0, e[2]) for e in _rows(hist, "evaluations") if e[2] is not None]
    # the totals when the budget ended (a job that ended early: at its end)
    accepted = status["accepted_results"]
    nbytes = status["network"]["bytes_in"] + status["network"]["bytes_out"]
    fin = status.get("finished")
    # A job that ended (converged) sent its volunteers home: rates are of the time
    # it trained, up to its final evaluation.
    elapsed = curve[-1][0] if fin and curve else read_at
    return {
        "curve": [(round(t, 3), a) for t, a in curve if t <= seconds + 1],
        "results_per_s": accepted / elapsed if elapsed else None,
        "bytes_per_task": nbytes / accepted if accepted else None,
        "bytes_per_volunteer_hour": nbytes / clients / (elapsed / 3600.0),
        "bytes_per_volunteer": nbytes / clients,
        "accepted": accepted,
        "ended": None if fin is None else {**fin, "at_s": round(elapsed, 1)},
        "joins_s": joins,
    }


def join_times(dashboard: dict, t0: float) -> list[float]:
    """When each client's hello arrived, in s after its process was started (the
    dashboard's rows): how long a crowd takes to assemble, which the simulator's
    ``clients.join_over_s`` stands for when it is calibrated against this run."""
    return sorted(round(c["joined"] - t0, 3) for c in dashboard["clients"])


def _rows(hist: dict, key: str) -> list[list]:
    """A history series' rows, each in the series' field order (coordinator/runtime/history.py)."""
    return [list(r) for r in hist[key]["rows"]]


def settled(curve: list[tuple[float, float]], t_end: float) -> float:
    """The anchor's accuracy at the end of its budget (``settled_accuracy``), floored
    to 4 decimals, not rounded: a tail of one point must be reached by that point."""
    return math.floor(settled_accuracy(curve, t_end) * 1e4 + 1e-6) / 1e4


def row(name: str, curve: list, target: float, anchor_t: float | None, extra: dict) -> dict:
    """One table row; with the held-out accuracy curve behind it (seconds, accuracy)."""
    t_85 = time_to(curve, 0.85)
    t_target = time_to(curve, target)
    accs = [a for _, a in curve]
    return {
        "run": name,
        "to_0.85_s": t_85,
        "to_anchor_acc_s": t_target,
        "speedup": (anchor_t / t_target) if (anchor_t and t_target) else None,
        "best": max(accs) if accs else None,
        "final": accs[-1] if accs else None,
        **extra,
        "curve": [[round(t, 3), a] for t, a in curve],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--workload", default="generated", help="digits, generated, generated-1m, csv or all"
    )
    ap.add_argument("--clients", help="crowd sizes, e.g. 1,2 (default 1, 2 and cores-2 if more)")
    ap.add_argument("--seconds", type=float, default=60.0, help="budget of every run")
    ap.add_argument("--grid", action="store_true", help="the anchor's optimizer grid")
    ap.add_argument("--tuned", action="store_true", help="also the tuned rows")
    ap.add_argument("--no-defaults", action="store_true", help="only the tuned rows")
    ap.add_argument(
        "--tuned-toml", help="tables appended to the job for the tuned rows (default: TUNED)"
    )
    ap.add_argument("--tuned-clients", help="crowd sizes of the tuned rows (default: --clients)")
    ap.add_argument("--out", type=Path, help="also write the results (JSON) here after every row")
    ap.add_argument(
        "--cold",
        action="store_true",
        help="no untimed warm-up crowd: the first crowd compiles the kernels numba has not cached",
    )
    ap.add_argument("--json", action="store_true", help="print results as JSON")
    args = ap.parse_args()
    if args.tuned_toml is not None:
        args.tuned = True
        for w in WORKLOADS:
            TUNED[w] = args.tuned_toml.replace("\\n", "\n") + "\n"
    workloads = list(WORKLOADS) if args.workload == "all" else args.workload.split(",")
    for w in workloads:
        if w not in WORKLOADS:
            ap.error(f"--workload: unknown {w!r}; expected one of {[*WORKLOADS, 'all']}")
    cores = os.cpu_count() or 1
    sizes = [1, 2] + ([cores - 2] if cores - 2 > 2 else [])
    if args.clients:
        sizes = [int(x) for x in args.clients.split(",")]
    tuned_sizes = [int(x) for x in args.tuned_clients.split(",")] if args.tuned_clients else sizes
    console = Console(stderr=True)
    results: list[dict] = []

    def save() -> dict:
        doc = {"seconds": args.seconds, "cores": cores, "rows": results}
        if args.out is not None:
            args.out.write_text(json.dumps(doc, indent=1))
        return doc

    with tempfile.TemporaryDirectory(prefix="crowd-bench-") as tmp:
        folder = Path(tmp)
        for w in workloads:
            job = job_file(folder, w, tuned=False)
            console.print(f"[bold]{w}[/bold]: anchor ({args.seconds:g} s)")
            a = anchor(job, args.seconds, args.grid, folder / f"anchor-{w}.json")
            target = settled(a["curve"], args.seconds)
            anchor_t = time_to(a["curve"], target)
            opt = a["optimizer"]
            results.append(
                {
                    "workload": w,
                    "target": target,
                    **row(
                        f"one machine ({opt['kind']} lr {opt['lr']:g}, {a['schedule']}, "
                        f"{a['threads']} thread(s))",
                        a["curve"],
                        target,
                        anchor_t,
                        {},
                    ),
                }
            )
            save()
            if not args.cold:
                console.print("  warm-up (untimed)")
                warm_up(job, folder)
            kinds = [] if args.no_defaults else [False]
            kinds += [True] if args.tuned and w in TUNED else []
            for tuned in kinds:
                jf = job_file(folder, w, tuned)
                for n in tuned_sizes if tuned else sizes:
                    console.print(f"  {n} client(s){' tuned' if tuned else ''}")
                    c = crowd(jf, n, args.seconds, folder)
                    name = f"{n} client(s), {'tuned' if tuned else 'defaults'}"
                    extra = {
                        k: c[k]
                        for k in (
                            "results_per_s",
                            "bytes_per_task",
                            "bytes_per_volunteer_hour",
                            "bytes_per_volunteer",
                            "ended",
                            "joins_s",
                        )
                    }
                    results.append(
                        {
                            "workload": w,
                            "target": target,
                            **row(name, c["curve"], target, anchor_t, extra),
                        }
                    )
                    save()
    doc = save()
    if args.json:
        print(json.dumps(doc, indent=1))
        return
    table = Table(title=f"crowd against the machine, {args.seconds:g} s, {cores} cores")
    for col in (
        "workload",
        "run",
        "target",
        "to 0.85 s",
        "to target s",
        "speedup",
        "best",
        "final",
        "results/s",
        "kB/task",
        "MB/vol-h",
        "ended",
    ):
        table.add_column(col)

    def f(x: float | None, spec: str = ".3g") -> str:
        return "—" if x is None else format(x, spec)

    for r in results:
        table.add_row(
            r["workload"],
            r["run"],
            f(r["target"]),
            f(r.get("to_0.85_s")),
            f(r.get("to_anchor_acc_s")),
            f(r.get("speedup"), ".2f"),
            f(r["best"]),
            f(r["final"]),
            f(r.get("results_per_s")),
            f(r["bytes_per_task"] / 1e3 if r.get("bytes_per_task") else None),
            f(r["bytes_per_volunteer_hour"] / 1e6 if r.get("bytes_per_volunteer_hour") else None),
            "" if not r.get("ended") else f"{r['ended']['reason']} at {r['ended']['at_s']:g} s",
        )
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
