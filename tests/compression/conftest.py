"""Shared trained models on digits (session-scoped: trained once, a second each)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from threadpoolctl import threadpool_limits  # installed with scikit-learn

from nn.data import Dataset, load_digits
from nn.optim import Optimizer, OptState
from nn.params import Params
from nn.spec import ModelSpec
from nn.train import train_steps


def train(widths: tuple[int, ...], data: Dataset, *, steps: int, seed: int = 0) -> Params:
    spec = ModelSpec(widths=widths)
    params = spec.init_params(seed)
    state = OptState.init(Optimizer(kind="momentum", lr=0.05, momentum=0.9), spec)
    train_steps(params, state, data.X_train, data.y_train, steps, 32, np.random.default_rng(seed))
    return params


@pytest.fixture(scope="session", autouse=True)
def one_blas_thread() -> Iterator[None]:
    """These models are small: with 2 OpenBLAS threads on a busy 2-core machine the
    threads spin against other processes and training runs ~30x slower."""
    with threadpool_limits(1):
        yield


@pytest.fixture(scope="session")
def digits() -> Dataset:
    return load_digits()


@pytest.fixture(scope="session")
def trained_small(digits: Dataset) -> Params:
    """[64, 128, 10] after 1500 steps: about 97 % test accuracy."""
    return train((64, 128, 10), digits, steps=1500)


@pytest.fixture(scope="session")
def teacher(digits: Dataset) -> Params:
    """[64, 256, 256, 10] after 1500 steps: about 98 % test accuracy."""
    return train((64, 256, 256, 10), digits, steps=1500)
