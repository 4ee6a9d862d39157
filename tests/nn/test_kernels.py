"""Kernels: gradients against finite differences, numba against the numpy oracle."""

from __future__ import annotations

import numpy as np
import pytest

from nn import kernels
from nn import reference as ref
from nn.spec import ModelSpec
from nn.train import layout_of

ACTS = ("identity", "relu", "tanh", "sigmoid")


def _problem(spec: ModelSpec, n: int, dtype, seed: int = 0):
    rng = np.random.default_rng(seed)
    data = spec.init_params(seed).data.astype(dtype)
    data += rng.standard_normal(data.size).astype(dtype) * dtype(0.1)  # nonzero biases
    X = rng.standard_normal((n, spec.widths[0])).astype(dtype)
    k = spec.widths[-1]
    if spec.loss == "mse":
        T = rng.standard_normal((n, k)).astype(dtype)
        labels = np.zeros(0, np.int64)
    else:
        T = np.zeros((0, k), dtype)
        labels = rng.integers(0, k, n).astype(np.int64)
    return data, X, T, labels


def _kernel_loss_grad(spec, data, X, T, labels):
    lay = layout_of(spec)
    G = np.zeros_like(data)
    value = kernels.loss_and_grad(data, lay.shapes, lay.offs, lay.acts, lay.loss, X, T, labels, G)
    return value, G


def _ref_layers(spec, data):
    Ws, bs = [], []
    for (w0, b0, end), (o, i) in zip(spec.layer_offsets(), spec.layer_shapes, strict=True):
        Ws.append(data[w0:b0].reshape(o, i).copy())
        bs.append(data[b0:end].copy())
    return Ws, bs


def _flat(Ws, bs):
    return np.concatenate([np.concatenate([W.ravel(), b]) for W, b in zip(Ws, bs, strict=True)])


@pytest.mark.parametrize("loss", ["mse", "softmax_ce"])
@pytest.mark.parametrize("act", ACTS)
def test_gradient_equals_central_differences_float64(act: str, loss: str) -> None:
    # The activation is on every layer, output included, so each one meets the loss.
    spec = ModelSpec(widths=(4, 6, 5, 3), activations=(act,) * 3, loss=loss)
    data, X, T, labels = _problem(spec, 7, np.float64)
    _, G = _kernel_loss_grad(spec, data, X, T, labels)
    h = 1e-6
    fd = np.empty_like(data)
    for k in range(data.size):
        up, down = data.copy(), data.copy()
        up[k] += h
        down[k] -= h
        lu = _kernel_loss_grad(spec, up, X, T, labels)[0]
        ld = _kernel_loss_grad(spec, down, X, T, labels)[0]
        fd[k] = (lu - ld) / (2 * h)
    np.testing.assert_allclose(G, fd, rtol=1e-5, atol=1e-8)
    # and the oracle's own gradient agrees, so the two share no mistake
    Ws, bs = _ref_layers(spec, data)
    y = T if loss == "mse" else labels
    _, dWs, dbs = ref.loss_and_grad(Ws, bs, spec.activations, loss, X, y)
    np.testing.assert_allclose(_flat(dWs, dbs), fd, rtol=1e-5, atol=1e-8)


def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize(
    "widths",
    [(5, 5, 5, 5, 3), (20, 64, 48, 5)],  # the second is big enough for the sgemm path
    ids=["loops", "blas"],
)
@pytest.mark.parametrize("loss", ["mse", "softmax_ce"])
@pytest.mark.parametrize("act", ACTS)
def test_float32_gradient_matches_reference(widths, loss: str, act: str) -> None:
    n = len(widths) - 1
    spec = ModelSpec(widths=widths, activations=(act,) * (n - 1) + ("identity",), loss=loss)
    data, X, T, labels = _problem(spec, 32, np.float32, seed=3)
    value, G = _kernel_loss_grad(spec, data, X, T, labels)
    Ws, bs = _ref_layers(spec, data.astype(np.float64))
    y = T.astype(np.float64) if loss == "mse" else labels
    rvalue, dWs, dbs = ref.loss_and_grad(Ws, bs, spec.activations, loss, X.astype(np.float64), y)
    assert abs(value - rvalue) <= 1e-5 * abs(rvalue)
    assert _rel_err(G, _flat(dWs, dbs)) <= 1e-5


def test_forward_matches_reference_beyond_one_block() -> None:
    spec = ModelSpec(widths=(20, 64, 7), activations=("tanh", "sigmoid"), loss="mse")
    data, X, _, _ = _problem(spec, 600, np.float32)  # 600 rows = three predict blocks
    lay = layout_of(spec)
    out = np.empty((600, 7), np.float32)
    kernels.predict_rows(data, lay.shapes, lay.offs, lay.acts, X, out)
    Ws, bs = _ref_layers(spec, data.astype(np.float64))
    want = ref.forward(Ws, bs, spec.activations, X.astype(np.float64))[-1]
    assert _rel_err(out, want) <= 1e-5


def test_softmax_ce_is_stable_for_large_logits() -> None:
    out = np.array([[1000.0, 0.0, -1000.0]], np.float32)
    D = np.empty_like(out)
    idx = np.zeros(1, np.int64)
    value = kernels.loss_grad_(out, 1, np.zeros((0, 3), np.float32), np.array([0]), idx, D)
    assert value == pytest.approx(0.0, abs=1e-6)
    assert np.isfinite(D).all()


def test_code_of_names_unknown_activation() -> None:
    with pytest.raises(ValueError, match="'swish'"):
        kernels.code_of("swish", kernels.ACT_CODES, "activation")


def _train_loop(spec, data, X, T, labels, idx, batch, opt, parts, eps=1e-8):
    lay = layout_of(spec)
    steps = len(idx) // batch
    n = data.size
    buf1 = np.zeros(n if opt else 0, data.dtype)
    buf2 = np.zeros(n if opt == 2 else 0, data.dtype)
    G = np.empty(n if opt else 0, data.dtype)
    losses = np.empty(steps)
    kernels.train_loop(
        data, lay.shapes, lay.offs, lay.acts, lay.loss, X, T, labels, idx, batch,
        opt, 0.01, 0.9, False, 0.9, 0.999, eps, 0, buf1, buf2, G, losses, parts,
    )  # fmt: skip
    return losses


@pytest.mark.parametrize("opt", [0, 2], ids=["sgd", "adam"])
@pytest.mark.parametrize("parts", [2, 3])
def test_neuron_groups_equal_the_whole_layer(opt: int, parts: int) -> None:
    # Any number of groups, uneven ones included (512 rows in 3), whatever the
    # thread count: prange runs the groups serially on one thread.
    spec = ModelSpec(widths=(12, 512, 512, 4), activations=("relu", "tanh", "identity"))
    data, X, T, labels = _problem(spec, 64, np.float32, seed=4)
    idx = np.random.default_rng(0).integers(0, 64, 5 * 16).astype(np.int64)
    assert kernels.split_layer(16, 512, 512, parts) == parts
    # Groups and whole layers may sum in another order (BLAS picks kernels by shape
    # and CPU), so gradients agree to rounding. Adam's first steps are about
    # lr * g / (|g| + eps): a weight whose gradient is rounding noise near zero
    # moves by up to lr either way (seen: 1e-3 apart on an AMD EPYC). A larger eps
    # keeps that noise at rounding size; the per-group m and v bookkeeping under
    # test is the same.
    eps = 1e-3 if opt == 2 else 1e-8
    whole, grouped = data.copy(), data.copy()
    lw = _train_loop(spec, whole, X, T, labels, idx, 16, opt, 1, eps)
    lg = _train_loop(spec, grouped, X, T, labels, idx, 16, opt, parts, eps)
    np.testing.assert_allclose(lg, lw, rtol=1e-5)
    assert _rel_err(grouped, whole.astype(np.float64)) <= 1e-5
    assert not np.array_equal(grouped, data)


def test_split_layer_keeps_small_layers_whole() -> None:
    assert kernels.split_layer(16, 512, 512, 1) == 1
    assert kernels.split_layer(16, 10, 1024, 2) == 1  # too few rows per group
    assert kernels.split_layer(2, 512, 512, 2) == 1  # too few multiply-adds
    assert kernels.split_layer(128, 1024, 1024, 4) == 4


@pytest.mark.parametrize("widths", [(7, 13, 5), (10, 128, 3), (3, 9, 11, 2), (4, 1)])
@pytest.mark.parametrize("batch", [1, 5, 16, 33])
def test_forward_from_the_feature_major_batch_matches_the_batch_major_path(widths, batch) -> None:
    # train_loop hands forward the batch feature-major too (XbT, issue 19): a hidden
    # first layer then runs W·XbT instead of W·Xbᵀ, which must change rounding only.
    spec = ModelSpec(widths=widths, activations=("tanh",) * (len(widths) - 1), loss="mse")
    data, X, _, _ = _problem(spec, 40, np.float32, seed=batch)
    lay = layout_of(spec)
    idx = np.random.default_rng(batch).integers(0, 40, batch)
    outs = []
    for fm in (False, True):
        aoff, abuf, _, _, Xb = kernels._workspace(lay.shapes, batch, data)
        XbT = np.full((widths[0], batch), np.nan, np.float32)
        if fm:
            kernels._gather(X, idx, Xb, XbT)
            np.testing.assert_array_equal(XbT, X[idx].T)
            out = kernels.forward(data, lay.shapes, lay.offs, lay.acts, Xb, abuf, aoff, None, XbT)
        else:
            kernels._gather(X, idx, Xb)
            out = kernels.forward(data, lay.shapes, lay.offs, lay.acts, Xb, abuf, aoff)
        np.testing.assert_array_equal(Xb, X[idx])
        outs.append(out.copy())
    Ws, bs = _ref_layers(spec, data.astype(np.float64))
    h = X[idx].astype(np.float64)
    for W, b in zip(Ws, bs, strict=True):
        h = np.tanh(h @ W.T + b)
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs[1], h, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("o,i,batch", [(128, 128, 16), (48, 64, 16), (7, 3, 1)])
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (-0.01, 1.0)], ids=["gradient", "sgd"])
def test_weight_product_through_a_batch_major_copy_equals_the_plain_product(
    o, i, batch, alpha, beta
) -> None:
    # Below UPDATE_COPY_MAX_MACS a hidden layer's update reads a batch-major copy
    # of its input (sgemm's small-matrix kernel instead of its packed "TN" path,
    # issue 19): the same product, to rounding; no scratch, no copy.
    rng = np.random.default_rng(o)
    dZ = rng.standard_normal((o, batch)).astype(np.float32)
    prev = rng.standard_normal((i, batch)).astype(np.float32)
    W = rng.standard_normal((o, i)).astype(np.float32)
    want = beta * W.astype(np.float64) + alpha * dZ.astype(np.float64) @ prev.T
    scratch = np.full(i * batch, np.nan, np.float32)
    assert o * i * batch <= kernels.UPDATE_COPY_MAX_MACS
    copied, plain = W.copy(), W.copy()
    kernels.weight_product_(dZ, True, prev, True, alpha, beta, copied, scratch)
    kernels.weight_product_(dZ, True, prev, True, alpha, beta, plain, scratch[:0])
    np.testing.assert_array_equal(scratch.reshape(batch, i), prev.T)  # the copy was made
    np.testing.assert_allclose(copied, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(plain, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act", kernels.ACT_CODES)
@pytest.mark.parametrize("fm", [True, False])
@pytest.mark.parametrize("mode", [kernels.MODE_SGD, kernels.MODE_GRAD])
def test_delta_and_bias_step_in_one_pass(act: str, fm: bool, mode: int) -> None:
    # The derivative and the bias step share one pass over the delta (issue 19):
    # D·act'(A), and the bias moved by the batch sum of that, in either layout.
    rng = np.random.default_rng(len(act))
    o, batch, lr = 37, 19, 0.05
    code = kernels.code_of(act, kernels.ACT_CODES, "activation")
    A = rng.uniform(-1, 1, (o, batch)).astype(np.float32)
    if act == "relu":
        A = np.maximum(A, 0)
    elif act == "sigmoid":
        A = (A + 1) / 2
    D = rng.standard_normal((o, batch)).astype(np.float32)
    slope = {"identity": 1.0, "relu": (A > 0) * 1.0, "tanh": 1 - A * A, "sigmoid": A * (1 - A)}
    want_d = D.astype(np.float64) * slope[act]
    b = rng.standard_normal(o).astype(np.float32)
    want_b = b - lr * want_d.sum(axis=1) if mode == kernels.MODE_SGD else want_d.sum(axis=1)
    if not fm:
        D, A = np.ascontiguousarray(D.T), np.ascontiguousarray(A.T)
    kernels.delta_bias_(D, A, code, b, mode, lr, fm)
    np.testing.assert_allclose(D if fm else D.T, want_d, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(b, want_b, rtol=1e-5, atol=1e-5)
    if act == "relu":  # an inactive unit passes nothing back, exactly
        assert not (D if fm else D.T)[A == 0 if fm else A.T == 0].any()
