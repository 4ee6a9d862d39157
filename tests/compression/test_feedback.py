"""Error feedback: the sum of decoded updates tracks the sum of true updates."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compression import CodecError, get
from compression.feedback import ErrorFeedback


@pytest.mark.parametrize("name", ["topk:0.01", "topk:0.05+int8", "int4-chunk", "int8"])
def test_decoded_sum_tracks_true_sum(name: str) -> None:
    rng = np.random.default_rng(0)
    codec = get(name)
    ef = ErrorFeedback(codec)
    true_sum = np.zeros((20, 30), np.float32)
    sent_sum = np.zeros_like(true_sum)
    plain_sum = np.zeros_like(true_sum)
    for _ in range(300):
        x = (rng.standard_normal(true_sum.shape) * 0.1 + 0.02).astype(np.float32)
        true_sum += x
        sent_sum += codec.decode(ef.encode("g0", x), x.shape)
        plain_sum += codec.decode(codec.encode(x), x.shape)
        # invariant: what was sent plus what is still owed is exactly what was produced
        np.testing.assert_allclose(sent_sum + ef.residual("g0"), true_sum, atol=2e-3)
    gap_ef = np.abs(sent_sum - true_sum).max()
    gap_plain = np.abs(plain_sum - true_sum).max()
    assert gap_ef < gap_plain
    assert gap_ef < 0.2 * np.abs(true_sum).max()


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rounds=st.integers(1, 20))
def test_residual_invariant_holds_for_any_sequence(seed: int, rounds: int) -> None:
    rng = np.random.default_rng(seed)
    codec = get("topk:0.1+int8")
    ef = ErrorFeedback(codec)
    total = np.zeros(50, np.float64)
    sent = np.zeros(50, np.float64)
    for _ in range(rounds):
        x = rng.standard_normal(50).astype(np.float32)
        total += x
        sent += codec.decode(ef.encode(("layer", 0), x), x.shape)
    np.testing.assert_allclose(sent + ef.residual(("layer", 0)), total, atol=1e-4)


def test_keys_are_independent_and_reset_forgets() -> None:
    ef = ErrorFeedback(get("topk:0.1"))
    x = np.arange(20, dtype=np.float32)
    ef.encode("a", x)
    assert ef.residual("b") is None
    ef.encode("b", x[:10].copy())
    assert len(ef) == 2 and ef.residual_norm() > 0
    ef.reset("a")
    assert ef.residual("a") is None and len(ef) == 1
    ef.reset()
    assert len(ef) == 0 and ef.residual_norm() == 0.0


def test_shape_change_is_an_error_and_lossless_keeps_no_residual() -> None:
    ef = ErrorFeedback(get("int8"))
    ef.encode("k", np.ones(4, np.float32))
    with pytest.raises(CodecError, match="changed shape"):
        ef.encode("k", np.ones(5, np.float32))
    lossless = ErrorFeedback(get("fp32"))
    lossless.encode("k", np.ones(4, np.float32))
    assert len(lossless) == 0
