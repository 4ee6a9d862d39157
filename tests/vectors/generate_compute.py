"""Conformance vectors for what a client computes (docs/protocol.md §11, §12):
``tests/vectors/compute/*.json``. Regenerate with
``python tests/vectors/generate_compute.py`` (about a minute: the extreme preset's
init CRC draws 26 G words).

Floats are JSON numbers holding float32 values exactly (a float32 widens to a
float64 without rounding, and JSON round-trips float64); byte strings are hex.

* ``rng.json``: the generator's state words and first outputs for several
  ``(seed, stream)`` pairs, ``below`` draws, a permutation and Irwin–Hall values.
* ``init.json``: seeded init of every preset (CRC-32 and the first values of each
  layer) and the whole of a small Xavier model.
* ``codecs.json``: the exact bytes of every codec for fixed blocks, a stochastic
  rounding encode, and an error-feedback sequence.
* ``task_<name>.json``: one task of each kind, its rows, the batches it draws and
  the expected update, loss and metrics, with the tolerance a client must meet;
  ``task_train_boundary`` also the boundary a layer-split lower task returns, and
  ``task_train_indices`` a task that trains on ``indices`` of its shard.

``--check`` rebuilds everything in memory and exits 1 (naming the files) if a file
on disk differs, is missing or is extra; ``--check --quick`` leaves out the extreme
preset's CRC (26 G words), which only the full check draws.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from client.compute import run_task
from compression import codecs
from compression.feedback import ErrorFeedback
from nn.rng import Xoshiro128ss, seed_state
from nn.spec import INIT_SCHEME, PRESETS, ModelSpec
from nn.train import batch_indices
from protocol import messages as m
from protocol.checksum import crc32
from protocol.shardfile import decode_shard, encode_shard, sha256_hex

OUT = Path(__file__).parent / "compute"

#: |got − want| <= atol + rtol·|want| per update value; losses to rtol. Clients sum
#: in other orders than BLAS does, so updates agree to float32 rounding, not bits.
TOLERANCE = {"update_atol": 1e-5, "update_rtol": 1e-4, "loss_rtol": 1e-5}

#: (seed, stream) pairs of rng.json: small, a layer stream, and both maxima
RNG_CASES = [(0, 0), (1, 0), (42, 7), (12345678901234567890, 3), (2**64 - 1, 2**32 - 1)]
BELOW_N = [1, 2, 7, 1000, 2**31 + 1, 2**32]


def f32(a: np.ndarray) -> list[float]:
    return [float(v) for v in np.asarray(a, np.float32).ravel()]


def irwin_hall(words: list[int]) -> float:
    """z of §12.1 from 12 words, in float64 (exact)."""
    return sum(words) * 2.0**-32 - 6.0


def rng_vectors() -> dict[str, Any]:
    cases = []
    for seed, stream in RNG_CASES:
        g = Xoshiro128ss(seed, stream)
        words = [int(w) for w in g.u32(24)]
        below = Xoshiro128ss(seed, stream)
        cases.append(
            {
                "seed": seed,
                "stream": stream,
                "state": list(seed_state(seed, stream)),
                "next_u32": words[:12],
                "irwin_hall_z": [irwin_hall(words[:12]), irwin_hall(words[12:24])],
                "below": [{"n": n, "value": below.below(n)} for n in BELOW_N],
                "permutation_10": Xoshiro128ss(seed, stream).permutation(10).tolist(),
            }
        )
    g = Xoshiro128ss(7, 0)
    return {
        "generator": "xoshiro128** 1.1, seeded as docs/protocol.md §12.1",
        "cases": cases,
        "below_note": "one fresh generator per case, below(n) for each n in order",
        "permutation_1000": {
            "seed": 7,
            "stream": 0,
            "crc32_le_u32": crc32(g.permutation(1000).astype("<u4").tobytes()),
        },
    }


def init_crc(spec: ModelSpec, seed: int, *, block: int = 1 << 24) -> tuple[int, list[list[float]]]:
    """CRC-32 of ``spec.init_params(seed)`` in Params layout order, streamed a block
    at a time (the extreme preset does not fit in memory), and each layer's first
    four weights."""
    crc, first = 0, []
    buf = np.empty(block, np.float32)
    for l, (o, i) in enumerate(spec.layer_shapes):
        g = Xoshiro128ss(seed, l)
        std = spec.init_std(l)
        left = o * i
        head: list[float] = []
        while left:
            part = buf[: min(block, left)]
            g.normal_into(part, std)
            if not head:
                head = f32(part[:4])
            crc = crc32(part.tobytes(), crc)
            left -= part.size
        first.append(head)
        crc = crc32(bytes(4 * o), crc)  # the zero biases
    return crc, first


def init_vectors(*, extreme: bool = True) -> dict[str, Any]:
    presets = []
    for name in PRESETS:
        spec = ModelSpec.preset(name)
        if name == "extreme" and not extreme:
            continue
        crc, first = init_crc(spec, 0)
        presets.append(
            {
                "preset": name,
                "spec": spec.to_dict(),
                "seed": 0,
                "num_params": spec.num_params,
                "crc32": crc,
                "first_weights": first,
            }
        )
    xavier = ModelSpec(widths=(4, 5, 3), activations=("tanh", "identity"), init="xavier")
    small = xavier.init_params(3)
    return {
        "scheme": INIT_SCHEME,
        "presets": presets,
        "whole": {
            "spec": xavier.to_dict(),
            "seed": 3,
            "params": f32(small.data),
            "crc32": crc32(small.data.tobytes()),
        },
    }


# -- codecs -------------------------------------------------------------------------

BLOCK = np.array(
    [
        [0.5, -1.25, 0.125, 2.0, -2.0, 0.0, 1e-3],  # a tie for top-k: |2.0| twice
        [0.0, -0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # an all-zero row: scale 0
        [2.5, -3.5, 0.5, 127.0, -126.5, 64.5, 1.0],  # scale 1: halves round to even
    ],
    np.float32,
)
VECTOR = np.array([0.3, -0.7, 0.0, 1.5, -1.5], np.float32)  # odd n: pad nibble, crumbs
CODECS = [
    "fp32",
    "fp16",
    "int8",
    "int4",
    "int8-chunk",
    "int4-chunk",
    "topk:0.25",
    "topk:0.25+int8",
    "int2",
]
SR_CODECS = ["int8-sr", "topk:0.25+int8-sr", "int2-sr"]


def codec_vectors() -> dict[str, Any]:
    blocks = {"block_3x7": BLOCK, "vector_5": VECTOR}
    out: dict[str, Any] = {
        "inputs": {k: {"shape": list(v.shape), "values": f32(v)} for k, v in blocks.items()},
        "encodings": [],
    }
    for name in CODECS:
        c = codecs.get(name)
        for key, x in blocks.items():
            payload = c.encode(x)
            out["encodings"].append(
                {
                    "codec": name,
                    "id": int(c.id),
                    "input": key,
                    "hex": payload.hex(),
                    "decoded": f32(c.decode(payload, x.shape)),
                }
            )
    task_seed = 9
    for name in SR_CODECS:
        c = codecs.get(name)
        payload = c.encode(BLOCK, rng=Xoshiro128ss(task_seed, 1))
        out["encodings"].append(
            {
                "codec": name,
                "id": int(c.id),
                "input": "block_3x7",
                "task_seed": task_seed,
                "stream": 1,
                "hex": payload.hex(),
                "decoded": f32(c.decode(payload, BLOCK.shape)),
            }
        )
    fb = ErrorFeedback(codecs.get("topk:0.25"))
    x2 = (BLOCK[::-1] * np.float32(0.5)).copy()
    steps = []
    for x in (BLOCK, x2):
        payload = fb.encode("block", x)
        r = fb.residual("block")
        steps.append({"input": f32(x), "hex": payload.hex(), "residual": f32(r)})
    out["error_feedback"] = {"codec": "topk:0.25", "shape": list(BLOCK.shape), "steps": steps}
    return out


# -- tasks --------------------------------------------------------------------------

CE = ModelSpec(widths=(4, 5, 3))  # relu, identity; softmax_ce; he


def _ce_rows() -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(2024)  # only to make numbers; the JSON carries them
    X = np.round(g.standard_normal((10, 4)), 3).astype(np.float32)
    y = np.array([0, 1, 2, 1, 0, 2, 2, 1, 0, 1], np.int32)
    return X, y


def _mse_rows() -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(7)
    X = np.round(g.standard_normal((6, 5)), 3).astype(np.float32)
    Y = np.round(g.standard_normal((6, 3)), 3).astype(np.float32)
    return X, Y


def _teacher(n: int) -> np.ndarray:
    g = np.random.default_rng(5)
    return (g.standard_normal((n, 3)) * 2).astype(np.float16)


#: name -> (spec, init seed, rows, task fields)
TASKS: dict[str, tuple[ModelSpec, int, str, dict[str, Any]]] = {
    "train_sgd": (CE, 11, "ce", {"kind": "train", "steps": 4, "batch": 4, "seed": 7,
                                 "optimizer": {"kind": "sgd", "lr": 0.1}}),
    "train_momentum": (CE, 11, "ce", {"kind": "train", "steps": 4, "batch": 4, "seed": 7,
                                      "optimizer": {"kind": "momentum", "lr": 0.1,
                                                    "momentum": 0.9}}),
    "train_nesterov": (CE, 11, "ce", {"kind": "train", "steps": 4, "batch": 4, "seed": 7,
                                      "optimizer": {"kind": "momentum", "lr": 0.1,
                                                    "momentum": 0.9, "nesterov": True}}),
    "train_adam": (CE, 11, "ce", {"kind": "train", "steps": 4, "batch": 4, "seed": 7,
                                  "optimizer": {"kind": "adam", "lr": 0.01, "beta1": 0.9,
                                                "beta2": 0.999, "eps": 1e-8}}),
    "train_mse_tiny": (ModelSpec.preset("tiny"), 5, "mse",
                       {"kind": "train", "steps": 3, "batch": 4, "seed": 3,
                        "optimizer": {"kind": "momentum", "lr": 0.05, "momentum": 0.9}}),
    "train_boundary": (CE, 11, "ce", {"kind": "train", "steps": 4, "batch": 4, "seed": 7,
                                      "optimizer": {"kind": "sgd", "lr": 0.1}, "boundary": 1}),
    "train_indices": (CE, 11, "ce", {"kind": "train", "steps": 3, "batch": 4, "seed": 5,
                                     "optimizer": {"kind": "sgd", "lr": 0.1},
                                     "indices": [9, 2, 7, 0, 5, 3]}),
    "gradient": (CE, 11, "ce", {"kind": "gradient", "steps": 2, "batch": 3, "seed": 7}),
    "evaluate": (CE, 11, "ce", {"kind": "evaluate", "seed": 7}),
    "evaluate_mse_tiny": (ModelSpec.preset("tiny"), 5, "mse", {"kind": "evaluate"}),
    "distill": (CE, 11, "ce", {"kind": "distill", "steps": 3, "batch": 4, "seed": 7,
                               "optimizer": {"kind": "momentum", "lr": 0.1, "momentum": 0.9},
                               "temperature": 2.0, "distill_alpha": 0.7}),
}  # fmt: skip


def task_of(name: str) -> tuple[m.Task, Any, np.ndarray, np.ndarray]:
    """The task, its shard and rows for vector ``name`` (also used by the tests)."""
    spec, _, rows, fields = TASKS[name]
    X, y = _ce_rows() if rows == "ce" else _mse_rows()
    classes = 3 if rows == "ce" else 0
    blob = encode_shard(X, y, classes=classes)
    extra: dict[str, Any] = {}
    if fields["kind"] == "distill":
        extra = {"indices": np.arange(X.shape[0], dtype=np.uint32), "teacher_logits": _teacher(10)}
    if "indices" in fields:  # rows of the shard, in this order (§12.2, §13)
        fields = {**fields, "indices": np.array(fields["indices"], dtype=np.uint32)}
    task = m.Task(
        task_id=name,
        model_version=0,
        spec=spec,
        dataset="vectors",
        base_version=0,
        data=sha256_hex(blob),
        **fields,
        **extra,
    )
    return task, decode_shard(blob), X, y


def task_vector(name: str) -> dict[str, Any]:
    spec, init_seed, _, fields = TASKS[name]
    task, shard, X, y = task_of(name)
    base = spec.init_params(init_seed)
    out = run_task(task, base, shard)
    doc: dict[str, Any] = {
        "name": name,
        "spec": spec.to_dict(),
        "init_seed": init_seed,
        "init_scheme": INIT_SCHEME,
        "base": f32(base.data),
        "X": f32(X),
        "y": y.tolist() if y.dtype.kind == "i" else f32(y),
        # int class labels, or float targets of width spec.widths[-1] (§13's shard t)
        "y_kind": "labels" if y.dtype.kind == "i" else "targets",
        "task": {k: v for k, v in fields.items()},
    }
    if task.indices is not None:  # a distill task's too: all of its shard, in order
        doc["task"]["indices"] = task.indices.tolist()
    if task.teacher_logits is not None:
        doc["task"]["teacher_logits"] = f32(task.teacher_logits.astype(np.float32))
    n = X.shape[0] if task.indices is None else task.indices.size
    if task.kind in ("train", "distill"):
        idx = batch_indices(n, task.steps, task.batch, Xoshiro128ss(task.seed, 0))
        # positions in the task's rows (indices order), not shard row numbers
        doc["batches"] = idx.reshape(task.steps, task.batch).tolist()
        if task.indices is not None:  # the same batches as shard row numbers
            rows = task.indices[idx].reshape(task.steps, task.batch)
            doc["batch_shard_rows"] = rows.tolist()
    elif task.kind == "gradient":
        doc["rows"] = (
            Xoshiro128ss(task.seed, 0).permutation(n)[: min(task.steps * task.batch, n)].tolist()
        )
    doc["expected"] = {
        "update": f32(out.update),
        "loss": out.loss,
        "samples": out.samples,
        "steps": out.steps,
        "metrics": out.metrics,
    }
    if out.boundary is not None:  # §3.3.2: every row, in order, under the trained block
        doc["expected"]["boundary"] = f32(out.boundary)
    doc["tolerance"] = TOLERANCE
    return doc


def build(*, extreme: bool = True) -> dict[str, Any]:
    docs: dict[str, Any] = {
        "rng": rng_vectors(),
        "codecs": codec_vectors(),
        "init": init_vectors(extreme=extreme),
    }
    for name in TASKS:
        docs[f"task_{name}"] = task_vector(name)
    return docs


def dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=1, allow_nan=False) + "\n"


def main(argv: list[str]) -> int:
    if "--check" in argv:
        quick = "--quick" in argv
        bad = []
        built = build(extreme=not quick)
        if quick:  # the extreme preset's entry is taken as it is on disk
            on_disk = json.loads((OUT / "init.json").read_text())
            built["init"]["presets"] += [p for p in on_disk["presets"] if p["preset"] == "extreme"]
        want = {f"{name}.json": dump_json(doc).encode() for name, doc in built.items()}
        have = {p.name for p in OUT.glob("*.json")}
        bad += [f"missing: {n}" for n in sorted(set(want) - have)]
        bad += [f"extra: {n}" for n in sorted(have - set(want))]
        bad += [
            f"differs: {n}" for n in sorted(set(want) & have) if (OUT / n).read_bytes() != want[n]
        ]
        for line in bad:
            print(line, file=sys.stderr)
        return 1 if bad else 0
    OUT.mkdir(exist_ok=True)
    for name, doc in build().items():
        (OUT / f"{name}.json").write_text(dump_json(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
