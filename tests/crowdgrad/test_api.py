"""The two-line API: an existing numpy set-up plus ``serve`` trains through a real coordinator."""

from __future__ import annotations

import numpy as np
import pytest

from crowdgrad import ModelSpec, ServeResult, serve
from nn.data import load_digits
from nn.params import Params
from nn.train import evaluate


def test_two_added_lines_train_digits(capsys: pytest.CaptureFixture[str]) -> None:
    ds = load_digits(seed=0)
    spec = ModelSpec(widths=(64, 64, 10))
    params = serve(spec, (ds.X_train, ds.y_train), clients=3)  # the added line
    assert evaluate(params, ds.X_test, ds.y_test).accuracy >= 0.9  # still a Params
    assert isinstance(params, ServeResult) and isinstance(params, Params)
    assert params.reason == "target_accuracy" and params.evaluation is not None
    assert params.evaluation["accuracy"] >= 0.95 and params.evaluation["version"] == params.version
    assert params.params.array_equal(params) and "target_accuracy" in repr(params)
    err = capsys.readouterr().err
    assert "serve: coordinator at ws://127.0.0.1:" in err and "local3 joined" not in err
    assert "first result accepted" in err and "job finished (target_accuracy)" in err


def test_a_timeout_is_an_error_unless_asked_otherwise() -> None:
    ds = load_digits(seed=0)
    spec = ModelSpec(widths=(64, 10))
    with pytest.raises(TimeoutError, match=r"timeout after 1 s at model v0 .*on_timeout='return'"):
        serve(spec, (ds.X_train, ds.y_train), clients=0, timeout=1.0, progress=False)
    result = serve(
        spec, (ds.X_train, ds.y_train), clients=0, timeout=1.0, on_timeout="return", progress=False
    )
    assert result.reason == "max_time" and result.version == 0


def test_mismatched_data_is_named() -> None:
    X = np.zeros((10, 5), np.float32)
    with pytest.raises(ValueError, match="input width"):
        serve(ModelSpec(widths=(64, 10)), (X, np.zeros(10, np.int64)))
