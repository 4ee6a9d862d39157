"""The two-line API: an existing numpy set-up plus ``serve`` trains through a real coordinator."""

from __future__ import annotations

import numpy as np
import pytest

from crowdgrad import serve
from nn.data import load_digits
from nn.spec import ModelSpec
from nn.train import evaluate


def test_two_added_lines_train_digits() -> None:
    ds = load_digits(seed=0)
    spec = ModelSpec(widths=(64, 64, 10))
    params = serve(spec, (ds.X_train, ds.y_train), clients=3)  # the added line
    assert evaluate(params, ds.X_test, ds.y_test).accuracy >= 0.9


def test_mismatched_data_is_named() -> None:
    X = np.zeros((10, 5), np.float32)
    with pytest.raises(ValueError, match="input width"):
        serve(ModelSpec(widths=(64, 10)), (X, np.zeros(10, np.int64)))
