"""nn.layersplit: cutting a spec, the blocks' numerics, determinism, accuracy on digits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nn import layersplit as ls
from nn.data import load_digits
from nn.optim import Optimizer
from nn.rng import Xoshiro128ss
from nn.spec import ModelSpec
from nn.train import evaluate, forward_outputs

SGD = Optimizer(kind="sgd", lr=0.4)
SPEC = ModelSpec(widths=(64, 32, 32, 10))


@st.composite
def spec_and_cuts(draw: st.DrawFn) -> tuple[ModelSpec, tuple[int, ...]]:
    widths = tuple(draw(st.lists(st.integers(1, 9), min_size=3, max_size=6)))
    L = len(widths) - 1
    cuts = sorted(draw(st.sets(st.integers(1, L - 1), min_size=1)))
    return ModelSpec(widths=widths), tuple(cuts)


@settings(max_examples=40, deadline=None)
@given(spec_and_cuts(), st.integers(0, 2**31))
def test_split_reproduces_the_network(sc: tuple[ModelSpec, tuple[int, ...]], seed: int) -> None:
    spec, cuts = sc
    blocks = ls.split_spec(spec, cuts)
    assert len(blocks) == len(cuts) + 1
    assert [b.widths[0] for b in blocks] == [spec.widths[0]] + [spec.widths[c] for c in cuts]
    widths = [w for b in blocks for w in b.widths[1:]]
    assert (spec.widths[0], *widths) == spec.widths
    assert sum((b.activations for b in blocks), ()) == spec.activations
    assert sum(b.num_params for b in blocks) == spec.num_params
    params = spec.init_params(seed % 1000)
    parts = ls.split_params(params, cuts)
    assert [p.spec for p in parts] == blocks
    assert ls.join_params(spec, parts).array_equal(params)
    # the blocks in a row compute the whole network (up to the kernels' rounding)
    X = np.random.default_rng(seed).standard_normal((17, spec.widths[0])).astype(np.float32)
    h = X
    for p in parts:
        h = forward_outputs(p, h)
    np.testing.assert_allclose(h, forward_outputs(params, X), rtol=1e-5, atol=1e-5)
    for k in range(len(blocks) - 1):
        aux = ls.train_spec(spec, cuts, k)
        assert aux.widths == (*blocks[k].widths, spec.widths[-1])
        assert aux.activations[-1] == spec.activations[-1]
    assert ls.train_spec(spec, cuts, len(blocks) - 1) == blocks[-1]


@pytest.mark.parametrize("cuts", [(0,), (3,), (2, 1), (1, 1), (-1,)])
def test_bad_cuts_are_refused(cuts: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="cuts"):
        ls.split_spec(SPEC, cuts)


def test_join_refuses_blocks_that_do_not_fit() -> None:
    parts = ls.split_params(SPEC.init_params(0), (1,))
    with pytest.raises(ValueError, match="join"):
        ls.join_params(SPEC, parts[::-1])
    with pytest.raises(ValueError, match="join"):
        ls.join_params(SPEC, parts[:1])


def test_blocks_start_from_the_whole_networks_init() -> None:
    whole = SPEC.init_params(7)
    blocks = ls.init_blocks(SPEC, (1,), seed=7, optimizer=SGD)
    assert ls.joined(SPEC, blocks).array_equal(whole)
    head = blocks[0].params.W[-1]
    assert head.shape == (10, 32) and np.abs(head).sum() > 0
    assert not blocks[0].is_last and blocks[1].is_last
    # the block's weights are a view of its training buffer's prefix
    blocks[0].block_params.data[0] = 42.0
    assert blocks[0].params.data[0] == 42.0


def _digits(n: int = 600):
    ds = load_digits()
    return ds.X_train[:n], ds.y_train[:n]


def test_no_cut_is_whole_training_bit_for_bit() -> None:
    X, y = _digits(300)
    kw = {"epochs": 3, "batch": 32, "optimizer": Optimizer(kind="adam", lr=0.003), "seed": 5}
    whole = ls.train_whole(SPEC, X, y, **kw)
    split = ls.train_split(SPEC, (), X, y, **kw)
    assert ls.joined(SPEC, split).array_equal(whole)
    assert not whole.array_equal(SPEC.init_params(5))


def test_no_gradient_crosses_the_cut() -> None:
    """Block 0 trains the same whatever is above it: DGL is decoupled."""
    X, y = _digits(300)
    other = ModelSpec(widths=(64, 32, 8, 8, 10))
    kw = {"epochs": 2, "batch": 16, "optimizer": SGD, "seed": 3}
    a = ls.train_split(SPEC, (1,), X, y, **kw)
    b = ls.train_split(other, (1,), X, y, **kw)
    assert a[0].params.array_equal(b[0].params)
    assert not a[0].params.array_equal(ls.init_blocks(SPEC, (1,), seed=3, optimizer=SGD)[0].params)


def test_the_boundary_handed_on_is_from_before_the_step() -> None:
    X, y = _digits(64)
    b = ls.init_blocks(SPEC, (1,), seed=0, optimizer=SGD)[0]
    before = b.boundary(X)
    h = b.forward_and_step(X, y)
    np.testing.assert_array_equal(h, before)
    assert not np.array_equal(b.boundary(X), before)
    assert h.shape == (64, 32) and (h >= 0).all()  # after the boundary's ReLU


def test_same_seed_same_bits_other_seed_other_bits() -> None:
    X, y = _digits(300)
    kw = {"epochs": 2, "batch": 32, "optimizer": SGD}
    runs = [ls.train_split(SPEC, (1, 2), X, y, seed=s, **kw) for s in (1, 1, 2)]
    for k in range(3):
        assert runs[0][k].params.array_equal(runs[1][k].params)
        assert not runs[0][k].params.array_equal(runs[2][k].params)


def test_epoch_batches_are_full_and_distinct() -> None:
    rng = Xoshiro128ss(0, 1)
    batches = ls.epoch_batches(100, 32, rng)
    assert [len(b) for b in batches] == ls.batch_sizes(100, 32) == [32, 32, 32]
    rows = np.concatenate(batches)
    assert len(set(rows.tolist())) == 96 and rows.max() < 100
    # the rows left out change from epoch to epoch
    again = np.concatenate(ls.epoch_batches(100, 32, rng))
    assert set(range(100)) - set(rows.tolist()) != set(range(100)) - set(again.tolist())
    assert [len(b) for b in ls.epoch_batches(5, 32, rng)] == ls.batch_sizes(5, 32) == [5]


def test_split_reaches_whole_accuracy_on_digits() -> None:
    """A loose bound (the benchmark measures the tight one): 2 blocks within 2
    points of whole training, 3 seeds, 15 epochs; about a second."""
    ds = load_digits()
    spec = ModelSpec(widths=(64, 64, 64, 10))
    kw = {"epochs": 15, "batch": 32, "optimizer": Optimizer(kind="sgd", lr=0.2)}
    whole, split, aux = [], [], []
    for seed in range(3):
        w = ls.train_whole(spec, ds.X_train, ds.y_train, seed=seed, **kw)
        blocks = ls.train_split(spec, (1,), ds.X_train, ds.y_train, seed=seed, **kw)
        whole.append(evaluate(w, ds.X_test, ds.y_test).accuracy)
        split.append(evaluate(ls.joined(spec, blocks), ds.X_test, ds.y_test).accuracy)
        aux.append(evaluate(blocks[0].params, ds.X_test, ds.y_test).accuracy)
    assert np.mean(whole) > 0.95
    assert np.mean(split) > np.mean(whole) - 0.02
    # the joined network, not an untrained top: a random top is near chance
    fresh_top = ls.split_params(spec.init_params(0), (1,))[1]
    untrained_top = ls.join_params(spec, [blocks[0].block_params, fresh_top])
    assert evaluate(untrained_top, ds.X_test, ds.y_test).accuracy < 0.5
    assert np.mean(aux) > 0.9
