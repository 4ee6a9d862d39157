"""Models out: npz, safetensors and ONNX, each read back by its own library.

The ONNX graph is held to the numpy oracle (nn/reference.py) by running it in
onnxruntime; compressed models come from the real ``crowdgrad compress``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

from compression.prune import magnitude_prune
from compression.quantize import QuantizedModel, load_quantized, quantize_model
from crowdgrad.cli import main
from crowdgrad.export import (
    ONNX_OPSET,
    ExportError,
    export_model,
    load_model_file,
    output_path,
    to_onnx,
)
from nn import reference
from nn.modelfile import load_model, save_model
from nn.params import Params
from nn.spec import ModelSpec
from storage import Checkpoint, CheckpointStore

RNG = np.random.default_rng(7)
X = RNG.random((33, 12), dtype=np.float32)


def run_onnx(path_or_bytes: Path | bytes, X: np.ndarray) -> np.ndarray:
    data = path_or_bytes if isinstance(path_or_bytes, bytes) else path_or_bytes.read_bytes()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input"]
    assert [o.name for o in session.get_outputs()] == ["output"]
    return session.run(None, {"input": X})[0]


def numpy_forward(params: Params, X: np.ndarray, *, softmax: bool = False) -> np.ndarray:
    out = reference.forward(list(params.W), list(params.b), params.spec.activations, X)[-1]
    if softmax:
        e = np.exp(out - out.max(axis=1, keepdims=True))
        out = e / e.sum(axis=1, keepdims=True)
    return out


@pytest.mark.parametrize(
    "activations",
    [("relu", "relu", "identity"), ("tanh", "sigmoid", "identity"), ("sigmoid", "tanh", "relu")],
)
@pytest.mark.parametrize("softmax", [False, True])
def test_onnx_graph_matches_the_numpy_forward(activations: tuple[str, ...], softmax: bool) -> None:
    params = ModelSpec(widths=(12, 20, 16, 5), activations=activations).init_params(3)
    proto = to_onnx(params, softmax=softmax)
    assert proto.opset_import[0].version == ONNX_OPSET
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("Gemm") == 3 and ("Softmax" in ops) == softmax
    got = run_onnx(proto.SerializeToString(), X)
    np.testing.assert_allclose(got, numpy_forward(params, X, softmax=softmax), rtol=1e-5, atol=1e-5)


def test_int8_onnx_dequantizes_in_the_graph_and_stays_small() -> None:
    params = ModelSpec(widths=(12, 256, 64, 10)).init_params(1)
    q = quantize_model(params)
    proto = to_onnx(q)
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("DequantizeLinear") == 3
    weights = {i.name: i for i in proto.graph.initializer}
    assert weights["layers.0.weight_quantized"].data_type == onnx.TensorProto.INT8
    assert len(proto.SerializeToString()) < len(to_onnx(params).SerializeToString()) / 3
    got = run_onnx(proto.SerializeToString(), X)
    np.testing.assert_allclose(got, numpy_forward(q.dequantize(), X), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got, q.forward(X), rtol=1e-4, atol=1e-4)


def test_safetensors_names_metadata_and_int8(tmp_path: Path) -> None:
    params = ModelSpec(widths=(12, 8, 3)).init_params(2)
    path = export_model(params, tmp_path / "m.safetensors", "safetensors", metadata={"v": 4})
    tensors = load_file(path)
    assert sorted(tensors) == [
        "layers.0.bias",
        "layers.0.weight",
        "layers.1.bias",
        "layers.1.weight",
    ]
    assert np.array_equal(tensors["layers.1.weight"], params.W[1])
    with safe_open(path, "np") as f:
        meta = f.metadata()
    assert meta["format"] == "crowdgrad-model" and json.loads(meta["metadata"]) == {"v": 4}
    assert ModelSpec.from_dict(json.loads(meta["spec"])) == params.spec

    q = quantize_model(params)
    path = export_model(q, tmp_path / "q.safetensors", "safetensors")
    tensors = load_file(path)
    assert tensors["layers.0.weight"].dtype == np.int8
    deq = tensors["layers.0.weight"].astype(np.float32) * tensors["layers.0.weight_scale"][:, None]
    assert np.array_equal(deq, q.dequantize().W[0])
    with safe_open(path, "np") as f:
        assert f.metadata()["scheme"] == "int8-row"


def test_output_path_rules(tmp_path: Path) -> None:
    assert output_path(tmp_path / "m", "onnx") == tmp_path / "m.onnx"
    assert output_path(tmp_path / "m.v2", "npz") == tmp_path / "m.v2.npz"
    with pytest.raises(ExportError, match="does not exist; create it first"):
        output_path(tmp_path / "nope" / "m.onnx", "onnx")
    with pytest.raises(ExportError, match=r"ends in \.npz but the format is onnx"):
        output_path(tmp_path / "m.npz", "onnx")
    (tmp_path / "d.onnx").mkdir()
    with pytest.raises(ExportError, match="is a directory"):
        output_path(tmp_path / "d.onnx", "onnx")


def test_missing_onnx_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx now raises ImportError
    with pytest.raises(ExportError, match=r"pip install 'crowdgrad\[export\]'"):
        to_onnx(ModelSpec(widths=(2, 2)).init_params(0))


# -- the CLI ------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "run.db"
    params = ModelSpec(widths=(12, 16, 4)).init_params(5)
    with CheckpointStore.open(path) as s:
        s.save(Checkpoint(version=7, created_at=1.7e9, params=params, metadata={"job": "t"}))
    return path


@pytest.mark.parametrize("fmt", ["npz", "safetensors", "onnx"])
def test_cli_exports_a_checkpoint_and_says_so_in_a_sentence(
    store: Path, tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "model"
    assert (
        main(["checkpoint", "export", "--store", str(store), "--format", fmt, "--out", str(out)])
        == 0
    )
    said = capsys.readouterr().out
    path = out.with_suffix(f".{fmt}")
    assert said.startswith(f"Exported checkpoint v7 of {store} (12-16-4, 276 parameters) to {path}")
    assert "{" not in said
    expected = ModelSpec(widths=(12, 16, 4)).init_params(5)
    if fmt == "onnx":
        np.testing.assert_allclose(run_onnx(path, X), numpy_forward(expected, X), atol=1e-5)
        meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
        assert json.loads(meta["crowdgrad.metadata"])["checkpoint_version"] == 7
    elif fmt == "safetensors":
        assert np.array_equal(load_file(path)["layers.0.weight"], expected.W[0])
    else:
        params, _, meta = load_model(path)
        assert params.array_equal(expected) and meta["checkpoint_version"] == 7
        assert path.with_suffix(".json").exists()


def test_cli_exports_compressed_models_that_run_in_onnxruntime(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from nn.data import load_digits

    digits = load_digits()
    X64 = digits.X_test[:50]
    teacher = ModelSpec(widths=(64, 32, 10)).init_params(0)
    save_model(tmp_path / "teacher.npz", teacher)
    variants = {
        "pruned": ["--prune", "0.5", "--finetune-steps", "5"],
        "int8": ["--quantize", "int8"],
        "distilled": ["--distill", "64,16,10", "--distill-steps", "5"],
        "all": ["--distill", "64,16,10", "--distill-steps", "5", "--prune", "0.25",
                "--finetune-steps", "5", "--quantize", "int8"],
    }  # fmt: skip
    for name, flags in variants.items():
        small = tmp_path / f"{name}.npz"
        assert main(["compress", str(tmp_path / "teacher.npz"), "-o", str(small), *flags]) == 0
        capsys.readouterr()
        out = tmp_path / f"{name}.onnx"
        assert main(["checkpoint", "export", "--model", str(small), "--out", str(out)]) == 0
        assert f"Exported model {small}" in capsys.readouterr().out
        model, _ = load_model_file(small)
        if isinstance(model, QuantizedModel):
            ref = numpy_forward(model.dequantize(), X64)
            assert load_quantized(small)[0].spec == model.spec
        else:
            ref = numpy_forward(model, X64)
        np.testing.assert_allclose(run_onnx(out, X64), ref, rtol=1e-4, atol=1e-4)
        st = tmp_path / f"{name}.safetensors"
        assert main(["checkpoint", "export", "--model", str(small), "--out", str(st)]) == 0
        assert load_file(st)["layers.0.bias"].shape == (model.spec.widths[1],)
    capsys.readouterr()
    unstructured, _ = magnitude_prune(teacher, 0.8)
    save_model(tmp_path / "sparse.npz", unstructured)
    out = tmp_path / "sparse.onnx"
    assert (
        main(["checkpoint", "export", "--model", str(tmp_path / "sparse.npz"), "--out", str(out)])
        == 0
    )
    np.testing.assert_allclose(run_onnx(out, X64), numpy_forward(unstructured, X64), atol=1e-5)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--out", "{tmp}/nodir/m.onnx"], "directory {tmp}/nodir does not exist; create it first"),
        (["--out", "{tmp}/m.npz", "--format", "onnx"], "ends in .npz but the format is onnx"),
        (["--out", "{tmp}/m.npz", "--softmax"], "--softmax goes with --format onnx only"),
        ([], "--out FILE is required"),
        (["--model", "{tmp}/m.npz", "--out", "{tmp}/x.onnx"], "not both"),
        (["--store-less", "--model", "{tmp}/none.npz", "--out", "{tmp}/x.onnx"], "does not exist"),
        (
            ["--store-less", "--out", "{tmp}/x.onnx"],
            "give --store FILE (a checkpoint store) or --model",
        ),
    ],
)
def test_cli_export_errors_are_sentences_not_tracebacks(
    store: Path, tmp_path: Path, argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    base = ["checkpoint", "export"]
    if "--store-less" in args:
        args.remove("--store-less")
    else:
        base += ["--store", str(store)]
    assert main([*base, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("crowdgrad checkpoint: error: ")
    assert needle.replace("{tmp}", str(tmp_path)) in err
