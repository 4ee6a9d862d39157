"""int8 post-training quantization: accuracy, kernel vs oracle, storage."""

from __future__ import annotations

import numpy as np
import pytest

from compression.quantize import (
    QuantizedModel,
    is_quantized_file,
    load_quantized,
    quantize_model,
)
from nn.modelfile import save_model
from nn.spec import ModelSpec
from nn.train import evaluate, forward_outputs


@pytest.mark.parametrize("acts", [("relu", "identity"), ("tanh", "sigmoid")])
def test_kernel_matches_float_forward_of_the_dequantized_model(acts) -> None:
    spec = ModelSpec(widths=(7, 13, 4), activations=acts)
    p = spec.init_params(3)
    p.b[0][:] = np.linspace(-1, 1, 13, dtype=np.float32)
    q = quantize_model(p)
    X = np.random.default_rng(1).random((9, 7), dtype=np.float32)
    np.testing.assert_allclose(q.forward(X), forward_outputs(q.dequantize(), X), atol=1e-5)
    # per-row quantization error: at most half a step of the row's scale
    for li, W in enumerate(p.W):
        qw, s, _ = q.layer(li)
        assert (np.abs(qw * s[:, None] - W) <= s[:, None] * 0.5 + 1e-7).all()


def test_int8_ptq_within_half_a_point(digits, trained_small) -> None:
    base = evaluate(trained_small, digits.X_test, digits.y_test).accuracy
    q = quantize_model(trained_small)
    assert abs(q.accuracy(digits.X_test, digits.y_test) - base) <= 0.005
    assert q.nbytes < trained_small.nbytes / 3.5


def test_save_load_round_trip(tmp_path, trained_small) -> None:
    q = quantize_model(trained_small)
    path = q.save(tmp_path / "m.npz", metadata={"source": "test"})
    assert is_quantized_file(path)
    back, meta = load_quantized(path)
    assert meta == {"source": "test"} and back.spec == q.spec
    np.testing.assert_array_equal(back.qw, q.qw)
    np.testing.assert_array_equal(back.scales, q.scales)
    assert path.stat().st_size < trained_small.nbytes / 3
    plain = save_model(tmp_path / "plain.npz", trained_small)
    assert not is_quantized_file(plain)
    with pytest.raises(ValueError, match="crowdgrad-qmodel"):
        load_quantized(plain)
    (tmp_path / "junk.npz").write_bytes(b"junk")
    with pytest.raises(ValueError, match="not a readable"):
        load_quantized(tmp_path / "junk.npz")


def test_inconsistent_arrays_are_rejected() -> None:
    spec = ModelSpec(widths=(3, 2))
    ok = dict(qw=np.zeros(6, np.int8), scales=np.ones(2, np.float32), bias=np.zeros(2, np.float32))
    QuantizedModel(spec=spec, **ok)
    with pytest.raises(ValueError, match="qw"):
        QuantizedModel(spec=spec, **{**ok, "qw": np.zeros(5, np.int8)})
    with pytest.raises(ValueError, match="non-finite"):
        QuantizedModel(spec=spec, **{**ok, "scales": np.array([1, np.nan], np.float32)})
    with pytest.raises(ValueError, match="X"):
        QuantizedModel(spec=spec, **ok).forward(np.zeros((2, 4), np.float32))
