"""Session 21: how few bits can a DiLoCo round's link carry before it needs more rounds?

K replicas of the generated job (``H`` SGD steps at lr 0.2, batch 16, each on its own
iid shard) run synchronous rounds with outer Nesterov 0.9 at the coordinator's auto lr,
as decentral-sync does. Each replica starts from the model *it holds* and uploads its
delta through ``UP``; the server averages the decoded deltas, steps, and sends the new
model down through ``DOWN``:

- ``UP``: a codec name (``compression.codecs.get``, ``int2-sr`` among them since this
  session), ``int2q-sr`` (a prototype here: levels -1.5..1.5 by one, a scale per row, 2
  bits a value) or ``fp32``; ``UPEF=1`` keeps each replica's error-feedback residual.
- ``DOWN``: ``exact`` (free), ``chain:CODEC`` (what the coordinator does: CODEC of
  the server's new version minus its last one, the full int8 model after 16 deltas in a
  row), or ``ef:CODEC`` (the server keeps the model the volunteers hold and sends CODEC
  of the difference, so nothing drifts and no full model is needed).

It prints one JSON line: rounds to each accuracy, each round's bytes down and up, and
the virtual seconds to each accuracy at ``LINK`` bytes/s each way and ``COMPUTE``
seconds of compute for 104 steps of 16 rows (the roblox player's 50 kB/s and 3.6 s),
with the 64-shard fetch and a full int8 model before the first round. ``LR``, ``BATCH``,
``MOM`` (outer momentum), ``SHARDS`` (replica i trains on shard i mod SHARDS) and
``CHAIN`` (deltas in a row before a full model, 16) vary the round; the defaults
are the 700-player benchmark's rounds.

    python docs/results/2026-11-29/compressed_rounds.py 64 104 80
    UP=topk:0.05+int8 UPEF=1 DOWN=chain:int4-sr python .../compressed_rounds.py 64 104 80
"""

import json
import math
import os
import sys

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, ".")

import numpy as np

THRESHOLDS = (0.75, 0.78, 0.80, 0.85)
LINK = float(os.environ.get("LINK", "50000"))
COMPUTE = float(os.environ.get("COMPUTE", "3.6"))
LATENCY = 0.1  # a round's two messages' latency on roblox (about)
SHARD_BYTES = 800_000  # a 64th of the generated job's rows, float32


class Real:
    """A registered codec: encode then decode, as the wire would."""

    def __init__(self, name: str) -> None:
        from compression import codecs

        self.codec = codecs.get(name)
        self.name = name

    def encode_decode(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return self.codec.decode(self.codec.encode(x, rng=rng), x.shape)

    def size(self, shape: tuple[int, ...]) -> int:
        return self.codec.encoded_size(shape)


class Int2FourSr:
    """Prototype: four levels (q - 1.5) * scale, q in 0..3, scale = max|x| / 1.5 per row,
    unbiased rounding: no zero level, but a quarter of ternary's variance mid-range."""

    name = "int2q-sr"

    def encode_decode(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        x2d = x.reshape(x.shape[0] if x.ndim == 2 else 1, -1)
        scales = (np.max(np.abs(x2d), axis=1) / np.float32(1.5)).astype(np.float32)
        y = np.divide(x2d, scales[:, None], out=np.zeros_like(x2d), where=scales[:, None] > 0)
        q = np.clip(np.floor(y + 1.5 + rng.random(y.shape, dtype=np.float32)), 0, 3)
        return ((q - 1.5).astype(np.float32) * scales[:, None]).reshape(x.shape)

    def size(self, shape: tuple[int, ...]) -> int:
        rows = shape[0] if len(shape) == 2 else 1
        return 4 * rows + math.ceil(math.prod(shape) / 4)


def codec_of(name: str):
    return Int2FourSr() if name == "int2q-sr" else Real(name)


def blocks(params) -> list[np.ndarray]:
    """The model's blocks as the wire chunks them: each layer's W (rows x in) and b."""
    out = []
    for w, b in params.layers:
        out += [w, b]
    return out


def coded(codec, params, delta_flat, rng, residual=None):
    """``delta_flat`` through ``codec`` block by block (with error feedback where a
    residual array is given); the decoded flat delta and its bytes."""
    view = type(params).from_flat(params.spec, delta_flat, copy=False)
    out, nbytes, off = np.empty_like(delta_flat), 0, 0
    for blk in blocks(view):
        n = blk.size
        x = blk if residual is None else blk + residual[off : off + n].reshape(blk.shape)
        d = codec.encode_decode(np.ascontiguousarray(x, np.float32), rng)
        if residual is not None:
            residual[off : off + n] = (x - d).reshape(-1)
        out[off : off + n] = d.reshape(-1)
        nbytes += codec.size(blk.shape)
        off += n
    return out, nbytes


def run(k: int, h: int, max_rounds: int) -> dict:
    from coordinator.core.strategies.aggregate import OuterLrScale, OuterOptimizer
    from coordinator.core.submodel import encoded_bytes
    from nn.data import classification_task, shard
    from nn.optim import Optimizer, OptState
    from nn.spec import ModelSpec
    from nn.train import evaluate, train_steps

    up_name = os.environ.get("UP", "int4-sr")
    up_ef = os.environ.get("UPEF", "0") == "1"
    down = os.environ.get("DOWN", "chain:int4-sr")
    lr_in, batch = float(os.environ.get("LR", "0.2")), int(os.environ.get("BATCH", "16"))
    mom = float(os.environ.get("MOM", "0.9"))
    shards = int(os.environ.get("SHARDS", str(k)))
    max_chain = int(os.environ.get("CHAIN", "16"))
    ds = classification_task(200_000, seed=0)
    spec = ModelSpec(widths=(64, 256, 256, 10))
    model = spec.init_params(0)
    state = OptState.init(Optimizer.from_dict({"kind": "sgd", "lr": lr_in}), spec)
    parts = shard(ds.y_train, shards, kind="iid", seed=0)
    data = [(ds.X_train[parts[i % shards]], ds.y_train[parts[i % shards]]) for i in range(k)]
    rngs = [np.random.default_rng(1 + i) for i in range(k)]
    crng = np.random.default_rng(10_000)
    outer = OuterOptimizer(kind="nesterov", lr=1.0, momentum=mom)
    auto = OuterLrScale(kind="nesterov", momentum=mom)
    seen = min(1.0, h * batch / len(parts[0]))  # as RoundStrategy.coverage
    coverage = float(np.mean([1 - (1 - seen) ** len(range(j, k, shards)) for j in range(shards)]))
    up = None if up_name == "fp32" else codec_of(up_name)
    mode, _, down_name = down.partition(":")
    dcodec = codec_of(down_name) if down_name else None
    full_int8 = encoded_bytes(spec, "int8")
    held = model.data.copy()  # the model every volunteer holds
    residuals = [np.zeros_like(model.data) for _ in range(k)] if up_ef else [None] * k
    replica = model.copy()
    chain, hit, times, r, acc, clock = 0, {}, {}, 0, 0.0, 0.0
    clock = SHARD_BYTES / LINK + full_int8 / LINK  # the first task's fetches
    down_total = up_total = 0
    for r in range(1, max_rounds + 1):
        deltas, up_bytes = [], 0
        for i, ((X, y), rng) in enumerate(zip(data, rngs, strict=True)):
            replica.data[:] = held
            train_steps(replica, state, X, y, h, batch, rng)
            d = replica.data - held
            if up is not None:
                d, nb = coded(up, model, d, rng, residuals[i])
            else:
                nb = 4 * d.size
            up_bytes = max(up_bytes, nb)
            deltas.append(d)
        mean = np.mean(deltas, axis=0).astype(np.float32)
        lr = auto.observe(deltas, [1.0] * k, mean, coverage)
        last = model.data.copy()
        outer.step(model.data, mean, lr)
        if mode == "exact":
            held[:], down_bytes = model.data, 0
        elif mode == "chain":
            chain += 1
            if chain > max_chain:
                held[:], down_bytes, chain = model.data, full_int8, 0
            else:
                d, down_bytes = coded(dcodec, model, model.data - last, crng)
                held += d
        else:  # ef: the difference from what the volunteers hold
            d, down_bytes = coded(dcodec, model, model.data - held, crng)
            held += d
        clock += COMPUTE * h * batch / 1664 + LATENCY + (up_bytes + down_bytes) / LINK
        down_total, up_total = down_total + down_bytes, up_total + up_bytes
        ev = evaluate(model, ds.X_test[:5000], ds.y_test[:5000])
        acc = ev.accuracy
        for t in THRESHOLDS:
            if str(t) not in hit and acc >= t:
                hit[str(t)], times[str(t)] = r, round(clock, 1)
        if str(THRESHOLDS[-1]) in hit or not ev.loss < 1e6:
            break
    return {
        "k": k, "h": h, "lr": lr_in, "batch": batch, "momentum": mom, "shards": shards,
        "chain": max_chain,
        "up": up_name, "up_ef": up_ef, "down": down,
        "rounds_to": hit, "seconds_to": times, "rounds": r, "accuracy": acc,
        "down_bytes_per_round": round(down_total / r), "up_bytes_per_round": round(up_total / r),
    }  # fmt: skip


if __name__ == "__main__":
    k, h, max_rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    sys.stdout.write(json.dumps(run(k, h, max_rounds)) + "\n")
