"""The computation vectors in tests/vectors/compute (docs/protocol.md §11, §12)
against this implementation: generator, seeded init, codecs' bytes and tasks."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from client.compute import run_task
from compression import codecs
from compression.feedback import ErrorFeedback
from nn.rng import Xoshiro128ss
from nn.spec import INIT_SCHEME, ModelSpec
from protocol.checksum import crc32

VECTORS = Path(__file__).parents[1] / "vectors"
COMPUTE = VECTORS / "compute"
_spec = importlib.util.spec_from_file_location(
    "vectors_generate_compute", VECTORS / "generate_compute.py"
)
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

TASKS = sorted(p.stem for p in COMPUTE.glob("task_*.json"))


def load(name: str) -> dict:
    return json.loads((COMPUTE / f"{name}.json").read_text())


def test_every_task_kind_and_optimizer_has_a_vector() -> None:
    docs = [load(n) for n in TASKS]
    assert {d["task"]["kind"] for d in docs} == {"train", "gradient", "evaluate", "distill"}
    opts = {(d["task"]["optimizer"]["kind"], d["task"]["optimizer"].get("nesterov", False))
            for d in docs if "optimizer" in d["task"]}  # fmt: skip
    assert opts == {("sgd", False), ("momentum", False), ("momentum", True), ("adam", False)}
    assert {f"task_{n}" for n in gen.TASKS} == set(TASKS)


@pytest.mark.parametrize("case", load("rng")["cases"], ids=lambda c: f"{c['seed']}-{c['stream']}")
def test_generator_outputs(case: dict) -> None:
    g = Xoshiro128ss(case["seed"], case["stream"])
    assert list(g.state) == case["state"]
    words = g.u32(24).tolist()
    assert words[:12] == case["next_u32"]
    assert [gen.irwin_hall(words[:12]), gen.irwin_hall(words[12:])] == case["irwin_hall_z"]
    g = Xoshiro128ss(case["seed"], case["stream"])
    assert [g.below(b["n"]) for b in case["below"]] == [b["value"] for b in case["below"]]
    perm = Xoshiro128ss(case["seed"], case["stream"]).permutation(10)
    assert perm.tolist() == case["permutation_10"]


def test_generator_normals_are_the_irwin_hall_values() -> None:
    case = load("rng")["cases"][2]
    z = Xoshiro128ss(case["seed"], case["stream"]).normal(2, 1.0)
    assert z.tolist() == [float(np.float32(v)) for v in case["irwin_hall_z"]]
    perm = load("rng")["permutation_1000"]
    p = Xoshiro128ss(perm["seed"], perm["stream"]).permutation(1000)
    assert crc32(p.astype("<u4").tobytes()) == perm["crc32_le_u32"]


def test_whole_small_init() -> None:
    doc = load("init")
    assert doc["scheme"] == INIT_SCHEME
    whole = doc["whole"]
    p = ModelSpec.from_dict(whole["spec"]).init_params(whole["seed"])
    assert p.data.tolist() == whole["params"] and crc32(p.data.tobytes()) == whole["crc32"]


def _preset(name: str) -> dict:
    (doc,) = [p for p in load("init")["presets"] if p["preset"] == name]
    return doc


@pytest.mark.parametrize("name", ["tiny", "small", "medium", "large"])
def test_preset_init_crc(name: str) -> None:
    doc = _preset(name)
    p = ModelSpec.from_dict(doc["spec"]).init_params(doc["seed"])
    assert p.spec.num_params == doc["num_params"]
    assert crc32(p.data.tobytes()) == doc["crc32"]
    assert [W.reshape(-1)[:4].tolist() for W in p.W] == doc["first_weights"]


def test_streamed_init_crc_is_the_crc_of_init_params() -> None:
    """The streaming CRC the slow tests use for huge and extreme, on medium."""
    spec = ModelSpec.preset("medium")
    crc, first = gen.init_crc(spec, 0, block=1000)  # several blocks per layer
    p = spec.init_params(0)
    assert crc == crc32(p.data.tobytes()) and first == [W.reshape(-1)[:4].tolist() for W in p.W]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["huge", "extreme"])
def test_big_preset_init_crc(name: str) -> None:
    doc = _preset(name)
    spec = ModelSpec.from_dict(doc["spec"])
    assert spec.num_params == doc["num_params"]
    assert gen.init_crc(spec, doc["seed"]) == (doc["crc32"], doc["first_weights"])


def test_every_preset_has_init_vectors() -> None:
    assert [p["preset"] for p in load("init")["presets"]] == [
        "tiny", "small", "medium", "large", "huge", "extreme"
    ]  # fmt: skip


def _input(name: str) -> np.ndarray:
    inp = load("codecs")["inputs"][name]
    return np.array(inp["values"], np.float32).reshape(inp["shape"])


@pytest.mark.parametrize(
    "enc", load("codecs")["encodings"], ids=lambda e: f"{e['codec']}-{e['input']}"
)
def test_codec_bytes(enc: dict) -> None:
    x = _input(enc["input"])
    c = codecs.get(enc["codec"])
    rng = Xoshiro128ss(enc["task_seed"], enc["stream"]) if "task_seed" in enc else None
    assert int(c.id) == enc["id"]
    assert c.encode(x, rng=rng).hex() == enc["hex"]
    assert c.decode(bytes.fromhex(enc["hex"]), x.shape).ravel().tolist() == enc["decoded"]


def test_every_codec_has_a_byte_vector() -> None:
    names = {e["codec"] for e in load("codecs")["encodings"]}
    assert {"fp32", "fp16", "int8", "int4", "int8-chunk", "int4-chunk"} <= names
    assert {"topk:0.25", "topk:0.25+int8", "int8-sr"} <= names


def test_error_feedback_sequence() -> None:
    doc = load("codecs")["error_feedback"]
    fb = ErrorFeedback(codecs.get(doc["codec"]))
    for step in doc["steps"]:
        x = np.array(step["input"], np.float32).reshape(doc["shape"])
        assert fb.encode("block", x).hex() == step["hex"]
        assert fb.residual("block").ravel().tolist() == step["residual"]


def _close(got: float, want: float, rtol: float) -> bool:
    return abs(got - want) <= rtol * abs(want)


@pytest.mark.parametrize("name", TASKS)
def test_task(name: str) -> None:
    doc = load(name)
    task, shard, X, _ = gen.task_of(doc["name"])
    spec = ModelSpec.from_dict(doc["spec"])
    assert task.spec == spec and X.ravel().tolist() == doc["X"]
    base = spec.init_params(doc["init_seed"])
    assert base.data.tolist() == doc["base"]  # version 0 from the seed, exactly
    out = run_task(task, base, shard)
    want, tol = doc["expected"], doc["tolerance"]
    update = np.array(want["update"], np.float32)
    assert out.update.shape == update.shape
    np.testing.assert_allclose(out.update, update, rtol=tol["update_rtol"], atol=tol["update_atol"])
    assert _close(out.loss, want["loss"], tol["loss_rtol"])
    assert (out.samples, out.steps, out.metrics) == (
        want["samples"],
        want["steps"],
        want["metrics"],
    )
    if task.kind in ("train", "distill"):
        assert np.abs(update).max() > 10 * tol["update_atol"]  # the tolerance can fail
    if task.boundary is None:
        assert out.boundary is None and "boundary" not in want
    else:  # §3.3.2: every row's activations at that hidden layer, after training
        h = np.array(want["boundary"], np.float32).reshape(X.shape[0], -1)
        assert out.boundary is not None and out.boundary.shape == h.shape
        tol_h = {"rtol": tol["update_rtol"], "atol": tol["update_atol"]}
        np.testing.assert_allclose(out.boundary, h, **tol_h)


def test_vectors_are_current() -> None:
    """Everything but the extreme preset's CRC (slow above) is rebuilt and compared."""
    built = gen.build(extreme=False)
    for name, doc in built.items():
        on_disk = load(name)
        if name == "init":
            on_disk["presets"] = [p for p in on_disk["presets"] if p["preset"] != "extreme"]
        assert json.loads(gen.dump_json(doc)) == on_disk, name


def test_indices_vector_draws_positions_in_the_task_rows() -> None:
    """§12.2: with ``indices`` the batches are positions 0..len(indices)−1 in the
    task's rows (indices order), drawn exactly as without; ``batch_shard_rows``
    names the same rows by their shard row numbers."""
    doc = load("task_train_indices")
    idx = doc["task"]["indices"]
    assert len(set(idx)) == len(idx) < len(doc["y"])  # a proper, reordered subset
    assert idx != sorted(idx)
    assert [[idx[p] for p in b] for b in doc["batches"]] == doc["batch_shard_rows"]
    g = Xoshiro128ss(doc["task"]["seed"], 0)
    steps, batch = doc["task"]["steps"], doc["task"]["batch"]
    perm = np.concatenate([g.permutation(len(idx)) for _ in range(-(-steps * batch // len(idx)))])
    assert perm[: steps * batch].reshape(steps, batch).tolist() == doc["batches"]


def test_every_task_vector_says_whether_y_is_labels_or_targets() -> None:
    for name in TASKS:
        doc = load(name)
        mse_targets = ModelSpec.from_dict(doc["spec"]).loss == "mse"
        assert doc["y_kind"] == ("targets" if mse_targets else "labels"), name
        assert all(isinstance(v, int) for v in doc["y"]) == (doc["y_kind"] == "labels")
