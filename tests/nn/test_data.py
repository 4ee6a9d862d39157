"""Datasets and shards: fixed splits, teacher tasks, partition properties."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nn.data import (
    digits_arrays,
    load_dataset,
    load_digits,
    shard,
    split_indices,
    teacher_task,
)
from nn.optim import Optimizer, OptState
from nn.spec import ModelSpec
from nn.train import evaluate, train_steps

ROOT = Path(__file__).resolve().parents[2]


def test_digits_split_is_fixed_and_disjoint() -> None:
    a, b, c = load_digits(), load_digits(), load_digits(seed=1)
    assert a.X_train.shape == (1348, 64) and a.X_test.shape == (449, 64)
    assert a.X_train.dtype == np.float32 and a.y_train.dtype == np.int32
    assert a.X_train.min() >= 0.0 and a.X_train.max() <= 1.0
    assert np.array_equal(a.X_test, b.X_test) and np.array_equal(a.y_train, b.y_train)
    assert not np.array_equal(a.y_test, c.y_test)
    assert a.num_classes == 10 and set(np.unique(a.y_train)) == set(range(10))


def test_teacher_task_is_deterministic_and_learnable() -> None:
    spec = ModelSpec.preset("small")
    a = teacher_task(spec, n_train=2048, n_test=512, seed=3)
    b = teacher_task(spec, n_train=2048, n_test=512, seed=3)
    assert np.array_equal(a.y_train, b.y_train) and a.y_train.shape == (2048, 10)
    assert a.num_classes is None
    params = spec.init_params(0)
    before = evaluate(params, a.X_test, a.y_test)
    state = OptState.init(Optimizer(kind="adam", lr=0.01), spec)
    train_steps(params, state, a.X_train, a.y_train, 1500, 32, np.random.default_rng(0))
    after = evaluate(params, a.X_test, a.y_test)
    assert after.loss < 0.5 * before.loss
    assert after.accuracy > before.accuracy + 0.2


def test_load_dataset_names() -> None:
    assert load_dataset("teacher:tiny", n_train=10, n_test=5).X_train.shape == (10, 5)
    assert load_dataset("teacher:tiny", n_train=10, n_test=5).name == "teacher:tiny"
    with pytest.raises(ValueError, match="'mnist'"):
        load_dataset("mnist")
    with pytest.raises(ValueError, match="'bogus'"):
        load_dataset("teacher:bogus")
    with pytest.raises(ValueError, match="classify:<rows>"):
        load_dataset("classify:many")


def test_the_generated_classification_is_fixed_by_its_seed_and_learnable() -> None:
    a, b = load_dataset("classify:2000"), load_dataset("classify:2000")
    assert a.name == "classify:2000" and a.num_classes == 10
    assert a.X_train.shape == (2000, 64) and a.X_test.shape == (10_000, 64)
    assert a.X_train.dtype == np.float32 and set(np.unique(a.y_train)) == set(range(10))
    np.testing.assert_array_equal(a.X_train, b.X_train)
    assert not np.array_equal(a.X_train, load_dataset("classify:2000", seed=1).X_train)
    spec = ModelSpec(widths=(64, 32, 10))
    params = spec.init_params(0)
    opt = Optimizer(kind="sgd", lr=0.1)
    train_steps(params, OptState.init(opt, spec), a.X_train, a.y_train, 1500, 16,
                np.random.default_rng(0))  # fmt: skip
    assert evaluate(params, a.X_test, a.y_test).accuracy > 0.2  # chance is 0.1


@settings(max_examples=50, deadline=None)
@given(
    n=st.integers(20, 300),
    k=st.integers(1, 10),
    kind=st.sampled_from(["iid", "label_skew"]),
    seed=st.integers(0, 100),
)
def test_shards_partition_every_sample_once(n, k, kind, seed) -> None:
    y = np.random.default_rng(seed).integers(0, 10, n)
    try:
        shards = shard(y, k, kind=kind, seed=seed)
    except ValueError as exc:  # only a skew split may leave a shard empty
        assert kind == "label_skew" and "empty" in str(exc)
        return
    assert len(shards) == k
    allidx = np.concatenate(shards)
    assert np.array_equal(np.sort(allidx), np.arange(n))
    assert all(s.size > 0 for s in shards)
    if kind == "iid":
        assert max(s.size for s in shards) - min(s.size for s in shards) <= 1


def test_label_skew_limits_classes_per_shard() -> None:
    y = load_digits().y_train
    shards = shard(y, 10, kind="label_skew", classes_per_shard=2, seed=0)
    assert all(len(np.unique(y[s])) <= 2 for s in shards)
    iid = shard(y, 10, kind="iid", seed=0)
    assert all(len(np.unique(y[s])) == 10 for s in iid)
    assert shard(y, 10, kind="label_skew", seed=0)[0].tolist() == shards[0].tolist()


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"k": 0}, "k must"), ({"k": 3, "kind": "dirichlet"}, "'dirichlet'"), ({"k": 11}, "11")],
)
def test_shard_bad_arguments(kw, match) -> None:
    with pytest.raises(ValueError, match=match):
        shard(np.arange(10), **kw)


def test_digits_without_sklearn_match_sklearn() -> None:
    """The digits read from scikit-learn's file are its ``load_digits``, bit for bit."""
    sk = pytest.importorskip("sklearn.datasets").load_digits()
    pixels, labels = digits_arrays()
    assert pixels.dtype == sk.data.dtype and labels.dtype == sk.target.dtype
    assert np.array_equal(pixels, sk.data) and np.array_equal(labels, sk.target)
    ds = load_digits()
    tr, te = split_indices(len(sk.target), 0.25, 0)
    assert np.array_equal(ds.X_train, (sk.data[tr] / 16.0).astype(np.float32))
    assert np.array_equal(ds.y_test, sk.target[te].astype(np.int32))


def test_digits_load_does_not_import_sklearn() -> None:
    code = "import sys; import nn.data; nn.data.load_digits(); print('sklearn' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "False"
