"""Report: sizes and accuracies agree with the models; latency is a positive number."""

from __future__ import annotations

from compression.prune import magnitude_prune
from compression.quantize import quantize_model
from compression.report import compare, measure
from nn.train import evaluate


def test_measure_and_compare(digits, trained_small) -> None:
    X, y = digits.X_test, digits.y_test
    before = measure(trained_small, X, y, samples=20)
    assert before.size_bytes == trained_small.nbytes
    assert before.accuracy == evaluate(trained_small, X, y).accuracy
    assert before.latency_us > 0 and before.widths == (64, 128, 10)
    pruned, _ = magnitude_prune(trained_small, 0.5)
    q = quantize_model(pruned)
    after = measure(q, X, y, samples=20)
    assert after.size_bytes == q.nbytes
    assert after.nonzero_weights <= before.nonzero_weights // 2 + 1
    c = compare(before, after)
    assert c["size_ratio"] > 3.5
    assert c["accuracy_delta"] == after.accuracy - before.accuracy
