"""Pruning: exact sparsity, real width reduction, accuracy after fine-tuning."""

from __future__ import annotations

import numpy as np
import pytest

from compression.prune import (
    finetune,
    magnitude_prune,
    neuron_scores,
    prune_neurons,
    sparsity_of,
)
from nn.spec import ModelSpec
from nn.train import evaluate, forward_outputs


def test_magnitude_prune_hits_the_target_and_keeps_the_largest() -> None:
    p = ModelSpec(widths=(8, 20, 5)).init_params(1)
    pruned, masks = magnitude_prune(p, 0.75)
    assert sparsity_of(pruned) == pytest.approx(0.75, abs=0.01)
    for W0, W1, m in zip(p.W, pruned.W, masks, strict=True):
        assert np.abs(W0[~m]).max() <= np.abs(W0[m]).min()
        np.testing.assert_array_equal(W1[m], W0[m])
    np.testing.assert_array_equal(pruned.b[0], p.b[0])
    assert sparsity_of(p) == 0.0  # the input is not touched


def test_bad_fractions_are_rejected() -> None:
    p = ModelSpec(widths=(4, 4, 2)).init_params(0)
    for bad in (-0.1, 1.0, 1.5, True, "0.5"):
        with pytest.raises(ValueError, match="fraction"):
            magnitude_prune(p, bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="fraction"):
            prune_neurons(p, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="hidden layer"):
        prune_neurons(p, 0.5, layers=[1])


def test_prune_neurons_equals_zeroing_those_neurons() -> None:
    p = ModelSpec(widths=(6, 10, 8, 3)).init_params(2)
    small, keep = prune_neurons(p, 0.5)
    assert small.spec.widths == (6, 5, 4, 3)
    # oracle: zero the dropped neurons' outgoing columns in the full model
    ref = p.copy()
    for li, k in enumerate(keep):
        dropped = np.setdiff1d(np.arange(p.spec.widths[li + 1]), k)
        ref.W[li + 1][:, dropped] = 0.0
    X = np.random.default_rng(0).random((7, 6), dtype=np.float32)
    np.testing.assert_allclose(forward_outputs(small, X), forward_outputs(ref, X), atol=1e-5)
    scores = neuron_scores(p, 0)
    assert scores[keep[0]].min() >= np.delete(scores, keep[0]).max()


def test_structured_pruning_half_the_hidden_neurons_within_one_point(digits, trained_small) -> None:
    base = evaluate(trained_small, digits.X_test, digits.y_test).accuracy
    small, _ = prune_neurons(trained_small, 0.5)
    assert small.spec.widths == (64, 64, 10) and small.num_params == 64 * 65 + 10 * 65
    finetune(small, digits.X_train, digits.y_train, steps=300, rng=np.random.default_rng(0))
    after = evaluate(small, digits.X_test, digits.y_test).accuracy
    assert after >= base - 0.01, (base, after)


def test_masked_finetune_keeps_the_zeros_and_recovers(digits, trained_small) -> None:
    base = evaluate(trained_small, digits.X_test, digits.y_test).accuracy
    pruned, masks = magnitude_prune(trained_small, 0.8)
    finetune(
        pruned, digits.X_train, digits.y_train, steps=200, rng=np.random.default_rng(0), masks=masks
    )
    assert sparsity_of(pruned) >= 0.8 - 1e-3
    # 3 points: over init seeds 0-3 and finetune seeds 0-2 the loss ranged 0.5-2.9
    # points with NumPy's init and 0.9-2.7 with the portable one (docs/protocol.md
    # §12.3), so 2 points only ever held by the luck of one seed
    assert evaluate(pruned, digits.X_test, digits.y_test).accuracy >= base - 0.03


def test_finetune_is_deterministic(digits, trained_small) -> None:
    a, masks = magnitude_prune(trained_small, 0.5)
    b = a.copy()
    for p in (a, b):
        finetune(
            p, digits.X_train, digits.y_train, steps=20, rng=np.random.default_rng(4), masks=masks
        )
    assert a.array_equal(b)
