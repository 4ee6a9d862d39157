"""Checkpoint store throughput beside numpy.save / numpy.load of the same arrays.

For each preset, alternating in one run on the same directory: save a checkpoint
(SQLite, WAL, synchronous=FULL, every chunk sha256'd) vs ``np.save`` of the same
flat params buffer followed by ``fsync`` (our save fsyncs, so the baseline does
too); then load it back (every chunk verified) vs ``np.load``. Both reads come
from the page cache, as they do right after a write. Median of ``--rounds``.

``write_incl_fold_mb_s`` also counts folding the WAL into the main file, which
the store does on a background thread after the commit returns.

The delta-log rows are results/s of durable appends (one fsync per append) for a
batch of 1 and of 32 medium-preset deltas, FULL vs NORMAL.

    python benchmarks/storage.py [--presets large,huge] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# Run as a script, this file's folder is sys.path[0] and its name would shadow the
# ``storage`` package it measures.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from nn.spec import ModelSpec  # noqa: E402
from storage import Checkpoint, CheckpointStore, DeltaEntry, DeltaLog  # noqa: E402


def _npy_save(path: Path, arr: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, arr)
        f.flush()
        os.fsync(f.fileno())


def bench_preset(name: str, rounds: int, root: Path, synchronous: str = "FULL") -> dict:
    spec = ModelSpec.preset(name)
    params = spec.init_params(0)
    mb = params.nbytes / 1e6
    store = CheckpointStore.open(root / f"{name}-{synchronous}.db", synchronous=synchronous)
    npy = root / f"{name}.npy"
    w, wf, r, nw, nr = [], [], [], [], []
    try:
        for v in range(rounds):
            t = time.perf_counter()
            store.save(Checkpoint(version=v, created_at=0.0, params=params))
            w.append(time.perf_counter() - t)
            store.backend.wal_checkpoint()
            wf.append(time.perf_counter() - t)
            t = time.perf_counter()
            _npy_save(npy, params.data)
            nw.append(time.perf_counter() - t)
            t = time.perf_counter()
            back = store.load(v)
            r.append(time.perf_counter() - t)
            t = time.perf_counter()
            back_npy = np.load(npy)
            nr.append(time.perf_counter() - t)
            assert back.params.array_equal(params) and np.array_equal(back_npy, params.data)
            del back, back_npy
            if v:
                store.delete(v - 1)
    finally:
        store.close()
    med = statistics.median
    row = {
        "preset": name,
        "mb": round(mb, 1),
        "synchronous": synchronous,
        "write_mb_s": mb / med(w),
        "write_incl_fold_mb_s": mb / med(wf),
        "read_mb_s": mb / med(r),
        "npy_write_mb_s": mb / med(nw),
        "npy_read_mb_s": mb / med(nr),
    }
    row["write_ratio"] = row["write_mb_s"] / row["npy_write_mb_s"]
    row["write_incl_fold_ratio"] = row["write_incl_fold_mb_s"] / row["npy_write_mb_s"]
    row["read_ratio"] = row["read_mb_s"] / row["npy_read_mb_s"]
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}


def bench_deltalog(root: Path, synchronous: str, batch: int, appends: int) -> dict:
    n = ModelSpec.preset("medium").num_params
    delta = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    with DeltaLog(root / f"log-{synchronous}-{batch}.db", synchronous=synchronous) as log:
        t = time.perf_counter()
        for a in range(appends):
            log.append(
                DeltaEntry(result_id=f"{a}-{k}", base_version=0, version=1, weight=1.0, delta=delta)
                for k in range(batch)
            )
        dt = time.perf_counter() - t
    return {
        "synchronous": synchronous,
        "batch": batch,
        "appends_per_s": round(appends / dt, 1),
        "results_per_s": round(appends * batch / dt, 1),
        "ms_per_append": round(1e3 * dt / appends, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="large,huge")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        rows = [bench_preset(p, args.rounds, root) for p in args.presets.split(",")]
        rows.append(bench_preset("large", args.rounds, root, synchronous="NORMAL"))
        log_rows = [
            bench_deltalog(root, sync, batch, appends)
            for sync in ("FULL", "NORMAL")
            for batch, appends in ((1, 100), (32, 10))
        ]
    if args.json:
        print(json.dumps({"rows": rows, "deltalog": log_rows}, indent=2))
        return
    for r in rows:
        print(
            f"{r['preset']:>6} {r['synchronous']:>6} {r['mb']:>7} MB  "
            f"write {r['write_mb_s']:7.0f} MB/s ({r['write_ratio']:.2f}x npy, "
            f"{r['write_incl_fold_ratio']:.2f}x incl. WAL fold)  "
            f"read {r['read_mb_s']:7.0f} MB/s ({r['read_ratio']:.2f}x npy)"
        )
    for r in log_rows:
        print(
            f"delta log {r['synchronous']:>6} batch {r['batch']:>2}: "
            f"{r['ms_per_append']:.2f} ms/append, {r['results_per_s']:.0f} results/s"
        )


if __name__ == "__main__":
    main()
