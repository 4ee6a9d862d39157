"""A miniature coordinator for the crash tests: restore, then train and checkpoint forever.

Usage: ``python crash_worker.py STORE SEED RUN``. It restores the latest valid
checkpoint, replays the delta log, prints ``ready VERSION``, then loops: accept a
seeded batch of deltas, append them to the log (durable), print ``ack ID...``;
sometimes save a checkpoint, print ``ckpt VERSION``, truncate the log and prune.
A line is printed only after the commit it reports has returned, so every
complete ``ack`` line on stdout is an acknowledgement the store must honour.
The parent kills it with SIGKILL at a seeded random moment.
"""

from __future__ import annotations

import sys
import zlib

import numpy as np

from nn.spec import ModelSpec
from storage import (
    Checkpoint,
    CheckpointStore,
    DeltaEntry,
    DeltaLog,
    NoCheckpoint,
    RetentionPolicy,
    StoreLimits,
)

SPEC = ModelSpec(widths=(16, 128, 128, 8))
LIMITS = StoreLimits(max_chunk_bytes=8192)
WEIGHT = 0.5
RETENTION = RetentionPolicy(keep_last=3, keep_every=10)


def delta_for(result_id: str) -> np.ndarray:
    """The delta a result carries, a pure function of its id (so a checker can redo it)."""
    rng = np.random.default_rng(zlib.crc32(result_id.encode()))
    return (rng.standard_normal(SPEC.num_params) * 0.01).astype(np.float32)


def apply(params_data: np.ndarray, result_id: str) -> None:
    params_data += np.float32(WEIGHT) * delta_for(result_id)


def main(path: str, seed: int, run: int, limit: int | None = None) -> int:
    store = CheckpointStore.open(path, limits=LIMITS)
    dlog = DeltaLog(path)
    try:
        ckpt = store.load_latest()
        params, version, applied = ckpt.params, ckpt.version, list(ckpt.applied_results)
    except NoCheckpoint:
        params, version, applied = SPEC.init_params(0), 0, []
        store.save(Checkpoint(version=0, created_at=0.0, params=params))
        print("ckpt 0", flush=True)
    for e in dlog.replay(after_version=version):
        if e.base_version != version:
            raise SystemExit(
                f"log gap: entry {e.result_id} based on {e.base_version}, at {version}"
            )
        params.data += np.float32(e.weight) * e.delta
        version = e.version
        applied.append(e.result_id)
    print(f"ready {version}", flush=True)
    rng = np.random.default_rng(seed)
    i = 0
    while limit is None or i < limit:
        entries = []
        for _ in range(int(rng.integers(1, 5))):
            rid = f"{run}-{i}"
            i += 1
            entries.append(
                DeltaEntry(
                    result_id=rid,
                    base_version=version,
                    version=version + 1,
                    weight=WEIGHT,
                    delta=delta_for(rid),
                )
            )
            version += 1
        dlog.append(entries)
        for e in entries:
            apply(params.data, e.result_id)
            applied.append(e.result_id)
        print("ack " + " ".join(e.result_id for e in entries), flush=True)
        if rng.random() < 0.3:
            print(f"saving {version}", flush=True)
            store.save(
                Checkpoint(
                    version=version,
                    created_at=float(version),
                    params=params,
                    optimizer={"m": params.data * 2, "step": version},
                    applied_results=tuple(applied),
                )
            )
            print(f"ckpt {version}", flush=True)
            dlog.truncate(version)
            store.prune(RETENTION)
    store.close()
    dlog.close()
    return 0


if __name__ == "__main__":
    limit = int(sys.argv[4]) if len(sys.argv) > 4 else None
    sys.exit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), limit))
