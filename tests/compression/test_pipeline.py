"""The compress pipeline and its CLI, end to end on a small digits model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from compression.pipeline import CompressConfig, compress
from compression.quantize import QuantizedModel, load_quantized
from crowdgrad.cli import main
from nn.modelfile import load_model, save_model


def test_all_stages(digits, trained_small) -> None:
    config = CompressConfig(
        distill_widths=(64, 32, 10), distill_steps=600, prune=0.5, finetune_steps=100,
        quantize="int8",
    )  # fmt: skip
    before = trained_small.copy()
    result = compress(trained_small, digits, config)
    assert trained_small.array_equal(before)  # the input is not modified
    assert isinstance(result.model, QuantizedModel)
    assert result.after.widths == (64, 16, 10)
    assert result.after.size_bytes < result.before.size_bytes / 20
    assert result.after.accuracy > 0.9
    assert [s.split()[0] for s in result.stages] == ["distill", "prune", "fine-tune", "quantize"]


def test_bad_configs_name_the_fault(digits, trained_small) -> None:
    with pytest.raises(ValueError, match="prune_mode"):
        CompressConfig(prune_mode="random")
    with pytest.raises(ValueError, match="quantize"):
        CompressConfig(quantize="int3")
    with pytest.raises(ValueError, match="prune"):
        CompressConfig(prune=1.0)
    narrow = trained_small.spec.__class__(widths=(32, 10)).init_params(0)
    with pytest.raises(ValueError, match="features"):
        compress(narrow, digits, CompressConfig())


def test_cli_writes_model_and_report(tmp_path, trained_small, capsys) -> None:
    src = save_model(tmp_path / "model.npz", trained_small)
    out = tmp_path / "small.npz"
    args = [str(src), "--prune", "0.5", "--quantize", "int8", "-o", str(out), "--json"]
    assert main(["compress", *args, "--finetune-steps", "50"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == json.loads((tmp_path / "small.report.json").read_text())
    model, meta = load_quantized(out)
    assert model.spec.widths == (64, 64, 10) == tuple(report["after"]["widths"])
    assert meta["stages"][0].startswith("prune")
    assert report["size_ratio"] > 7 and report["after"]["latency_us"] > 0
    # without quantization the output is a plain model file
    out2 = tmp_path / "unstructured.npz"
    args = [str(src), "--prune", "0.5", "--prune-mode", "unstructured", "-o", str(out2)]
    assert main(["compress", *args, "--finetune-steps", "10"]) == 0
    params, _, _ = load_model(out2)
    assert np.count_nonzero(params.W[0] == 0) >= params.W[0].size // 2
    assert "accuracy" in capsys.readouterr().out


def test_cli_errors(tmp_path, capsys) -> None:
    assert main(["compress", str(tmp_path / "missing.npz"), "-o", str(tmp_path / "x")]) == 2
    assert "does not exist" in capsys.readouterr().err
