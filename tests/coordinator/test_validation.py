import numpy as np

from coordinator.core.config import ValidationSection
from coordinator.core.validation import Reject, UpdateValidator


def test_checks_in_order() -> None:
    v = UpdateValidator(ValidationSection(norm_warmup=2, norm_multiple=3.0), size=4)
    assert v.check(np.zeros(5, np.float32))[0] is Reject.SHAPE
    assert v.check(np.zeros((2, 2), np.float32))[0] is Reject.SHAPE
    assert v.check(np.zeros(4, np.float64))[0] is Reject.DTYPE
    assert v.check(np.array([0, np.inf, 0, 0], np.float32))[0] is Reject.NONFINITE
    ok, norm = v.check(np.ones(4, np.float32))
    assert ok is None and norm == 2.0
    # before warmup any norm is fine
    assert v.check(np.full(4, 100, np.float32))[0] is None
    v.accept(2.0)
    v.accept(2.0)
    assert v.median() == 2.0
    assert v.check(np.full(4, 2.5, np.float32))[0] is None  # norm 5 <= 6
    assert v.check(np.full(4, 4, np.float32))[0] is Reject.NORM  # norm 8 > 6


def test_zero_updates_do_not_count_towards_the_median() -> None:
    # Empty syncs from edges whose crowds had not trained yet made a root's
    # median zero, and it refused every later update for its norm.
    v = UpdateValidator(ValidationSection(norm_warmup=2, norm_multiple=3.0), size=4)
    for _ in range(10):
        assert v.check(np.zeros(4, np.float32))[0] is None
        v.accept(0.0)
    assert v.median() is None  # still warming up: nothing measured yet
    v.accept(2.0)
    v.accept(2.0)
    v.accept(0.0)
    assert v.median() == 2.0
    assert v.check(np.full(4, 2.5, np.float32))[0] is None


def test_median_window_resists_a_few_outliers() -> None:
    v = UpdateValidator(ValidationSection(norm_warmup=1, norm_window=5), size=1)
    for x in (1.0, 1.0, 1.0, 50.0, 50.0):
        v.accept(x)
    assert v.median() == 1.0
