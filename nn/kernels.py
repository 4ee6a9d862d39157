"""numba kernels of the MLP: forward, backward, losses and the fused train loop.

A model is a flat parameter buffer plus a *layout*: per layer ``shapes[l] = (out, in)`` and
``offs[l] = (w_start, b_start)`` into the buffer (``Params`` uses the same layout, so kernels
see its ``data`` directly). Hidden activations and their deltas are stored after the
nonlinearity and feature-major, ``[width, batch]``; the input batch and the output layer stay
``[batch, width]``, which is what callers (the loss, ``predict_rows``, the distillation loop)
read and write. ``train_loop`` runs all steps inside one compiled call, with the batch indices
drawn by the caller, so Python is entered once per call.

With ``parts > 1`` threads a big layer's rows are split into neuron groups, one per thread,
and no two threads share a row; partial ``dA_prev`` sums are added in group order, so a run is
bitwise reproducible for a given ``parts`` (1 and 2 threads differ by float rounding only).
Every kernel is ``nogil`` (clients run it off their IO thread) and generic over float32/float64
(float64 goes through loops: the finite-difference check path). Codes for activations, losses
and optimizers are the tuples below. How a step works and what it measured:
docs/performance.md ("Why the step is fast", "large/128"); why neuron groups: docs/decisions.md.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange
from numba.extending import overload

from nn.blas import gemm
from nn.threads import bound_omp_spin

# Neuron-group regions end in a barrier: spin there briefly, then sleep (see
# nn.threads.bound_omp_spin). Before numba loads its OpenMP layer (its first
# parallel call, not its import); an explicit setting by the user wins.
bound_omp_spin()

ACT_CODES = ("identity", "relu", "tanh", "sigmoid")
LOSS_CODES = ("mse", "softmax_ce")
OPT_CODES = ("sgd", "momentum", "adam")

_IDENTITY, _RELU, _TANH, _SIGMOID = 0, 1, 2, 3
_MSE, _CE = 0, 1
_SGD, _MOMENTUM, _ADAM = 0, 1, 2
#: ``mode`` of ``backward``: write the gradient into G, or apply SGD in place.
MODE_GRAD, MODE_SGD = 0, 1


def code_of(name: str, table: tuple[str, ...], what: str) -> int:
    """Kernel code of a name; unknown names are a ValueError naming the name."""
    try:
        return table.index(name)
    except ValueError:
        raise ValueError(f"{what}: unknown {what} {name!r}; expected one of {table}") from None


# -- layer pieces: forward and backward side by side ----------------------------------


@njit(cache=True, nogil=True)
def bias_act_(Z, b, act, fm):  # pragma: no cover - compiled
    """``Z := act(Z + b)`` in one pass over Z; ``fm``: Z is ``[out, batch]``."""
    if fm:
        O, B = Z.shape
        for j in range(O):
            bj = b[j]
            for r in range(B):
                Z[j, r] = _act(Z[j, r] + bj, act)
        return
    B, O = Z.shape
    for r in range(B):
        for j in range(O):
            Z[r, j] = _act(Z[r, j] + b[j], act)


@njit(cache=True, nogil=True)
def _act(z, act):  # pragma: no cover - compiled
    if act == _RELU:
        return z if z > 0 else z * 0
    if act == _TANH:
        return np.tanh(z)
    if act == _SIGMOID:
        return 1 / (1 + np.exp(-z))
    return z


@njit(cache=True, nogil=True)
def act_grad_(D, A, act):  # pragma: no cover - compiled
    """``D := D * act'(.)`` where the derivative is read from the output ``A``.

    Elementwise, so either layout works as long as D and A share it.
    """
    B, O = D.shape
    if act == _IDENTITY:
        return
    for r in range(B):
        for j in range(O):
            a = A[r, j]
            if act == _RELU:
                if not a > 0:
                    D[r, j] = 0
            elif act == _TANH:
                D[r, j] *= 1 - a * a
            else:
                D[r, j] *= a * (1 - a)


def zero_of(a):  # pragma: no cover - typed by the overload below
    """0 in the dtype of array ``a`` (compiled code only)."""


@overload(zero_of)
def _zero_of(a):  # pragma: no cover - compiled
    # A typed constant: ``0.0`` would widen float32 to float64, and ``x * 0`` is
    # not a constant to LLVM (inf·0 is NaN); either kept the loop below scalar
    # (0.56 µs against 0.29 µs for medium's 128×16 delta).
    dtype = a.dtype
    return lambda a: dtype(0)


# reassoc: lets LLVM vectorize the row sums of the feature-major case (same order
# on every run, so results stay reproducible).
@njit(cache=True, nogil=True, fastmath={"reassoc"})
def delta_bias_(D, A, act, bvec, mode, lr, fm):  # pragma: no cover - compiled
    """``D := D * act'(A)`` and the bias step from it, in one pass over a
    feature-major ``D``: ``MODE_SGD``: ``bvec -= lr·Σ_batch D``; ``MODE_GRAD``:
    ``bvec := Σ_batch D``.

    Why fused: at medium/16 a layer's delta is 2k values, and each separate pass
    over it (derivative, then bias sum) costs as much as the arithmetic (issue 19).
    """
    if not fm:  # the output layer, [batch, out]: the sums run across rows
        act_grad_(D, A, act)
        _bias_rows_(D, bvec, mode, lr)
        return
    O, B = D.shape
    zero = zero_of(D)
    one = zero + 1
    for j in range(O):
        s = zero
        # one loop per activation: a branch inside the loop kept it scalar
        if act == _RELU:
            for r in range(B):
                d = D[j, r] if A[j, r] > 0 else zero
                D[j, r] = d
                s += d
        elif act == _TANH:
            for r in range(B):
                d = D[j, r] * (one - A[j, r] * A[j, r])
                D[j, r] = d
                s += d
        elif act == _SIGMOID:
            for r in range(B):
                d = D[j, r] * (A[j, r] * (one - A[j, r]))
                D[j, r] = d
                s += d
        else:
            for r in range(B):
                s += D[j, r]
        bvec[j] = bvec[j] - lr * s if mode == MODE_SGD else s


@njit(cache=True, nogil=True)
def _bias_rows_(dZ, bvec, mode, lr):  # pragma: no cover - compiled
    B, O = dZ.shape
    if mode == MODE_SGD:
        for r in range(B):
            for j in range(O):
                bvec[j] -= lr * dZ[r, j]
        return
    for j in range(O):
        bvec[j] = 0
    for r in range(B):
        for j in range(O):
            bvec[j] += dZ[r, j]


@njit(cache=True, nogil=True)
def layer_forward_(prev, prev_fm, W, b, Z, fm, act):  # pragma: no cover - compiled
    """``Z := act(prev·Wᵀ + b)``; ``prev_fm`` / ``fm``: that operand is ``[width, batch]``."""
    if fm:
        gemm(False, not prev_fm, 1.0, W, prev, 0.0, Z)  # Zᵀ = W·prevᵀ
    else:
        gemm(prev_fm, True, 1.0, prev, W, 0.0, Z)  # Z = prev·Wᵀ
    bias_act_(Z, b, act, fm)


#: Up to this many multiply-adds (out·in·batch), a hidden layer's weight product
#: reads a batch-major copy of its input. Why: on feature-major operands
#: ``W -= lr·dZ·prevᵀ`` contracts both over their contiguous (batch) axis, the
#: "TN" case of column-major sgemm, which OpenBLAS keeps off its small-matrix
#: kernel (≤ 1e6 multiply-adds) once C has over 1,200 entries and packs both
#: operands instead: at medium/16 (128·128·16) that product took 6.5 µs, the
#: copy (2k floats) and the plain product 5.8 µs (issue 19). Above it the
#: packed path is the fast one anyway.
UPDATE_COPY_MAX_MACS = 1_000_000


@njit(cache=True, nogil=True)
def weight_product_(dZ, fm, prev, prev_fm, alpha, beta, GW, scratch):  # pragma: no cover
    """``GW := alpha·dZᵀ·prev + beta·GW`` in the layouts given (``dZ·prevᵀ`` when
    both are feature-major), through ``scratch`` (``batch·in`` values, or empty to
    skip the copy) below ``UPDATE_COPY_MAX_MACS`` in float32."""
    o, i = GW.shape
    B = dZ.shape[1] if fm else dZ.shape[0]
    small = GW.itemsize == 4 and o * i * B <= UPDATE_COPY_MAX_MACS  # sgemm's, not loops
    if fm and prev_fm and small and scratch.size >= B * i:
        P = scratch[: B * i].reshape(B, i)
        for k in range(i):
            for r in range(B):
                P[r, k] = prev[k, r]
        gemm(False, False, alpha, dZ, P, beta, GW)
    else:
        gemm(not fm, prev_fm, alpha, dZ, prev, beta, GW)


@njit(cache=True, nogil=True)
def layer_backward_(
    dZ, A, act, fm, prev, prev_fm, W, dA, GW, Gb, mode, lr, scratch
):  # pragma: no cover - compiled
    """Given ``dZ`` with respect to the layer's output ``A``: the derivative of
    ``act`` applied in place with the bias step (``delta_bias_``), ``dA := (dZ·W)ᵀ``
    into the ``[in, batch]`` dA (skipped when dA is empty), then the weight step.

    ``MODE_SGD``: GW and Gb are W and b, updated in place (``beta = 1``), after dA
    has read the old W. ``MODE_GRAD``: they receive the gradient. ``scratch``: see
    ``weight_product_`` (empty in neuron groups, which run side by side).
    """
    delta_bias_(dZ, A, act, Gb, mode, lr, fm)
    if dA.size:
        gemm(True, not fm, 1.0, W, dZ, 0.0, dA)  # dAᵀ = Wᵀ·dZᵀ
    if mode == MODE_SGD:
        weight_product_(dZ, fm, prev, prev_fm, -lr, 1.0, GW, scratch)  # W -= lr·dZᵀ·prev
    else:
        weight_product_(dZ, fm, prev, prev_fm, 1.0, 0.0, GW, scratch)


@njit(cache=True, nogil=True)
def loss_grad_(out, loss, T, labels, idx, D):  # pragma: no cover - compiled
    """Mean loss over the batch (float64) and ``D := dLoss/dout``.

    ``idx[r]`` is the dataset row of batch row ``r``: ``T`` (mse targets) and
    ``labels`` (softmax_ce) are indexed through it, so targets are never gathered.
    mse is the mean over all elements (as torch's ``MSELoss``); softmax_ce the mean
    over rows of ``logsumexp(z) - z[label]``.
    """
    B, K = out.shape
    total = 0.0
    if loss == _MSE:
        scale = 2.0 / (B * K)
        for r in range(B):
            t = idx[r]
            for j in range(K):
                e = out[r, j] - T[t, j]
                total += float(e) * float(e)
                D[r, j] = scale * e
        return total / (B * K)
    for r in range(B):
        m = out[r, 0]
        for j in range(1, K):
            if out[r, j] > m:
                m = out[r, j]
        s = 0.0
        for j in range(K):
            e = np.exp(out[r, j] - m)
            D[r, j] = e
            s += e
        lab = labels[idx[r]]
        total += math.log(s) + m - out[r, lab]
        inv = 1.0 / s
        for j in range(K):
            D[r, j] = D[r, j] * inv / B
        D[r, lab] -= 1.0 / B
    return total / B


# -- neuron groups: a big layer's rows split across threads ---------------------------

#: A layer is split into row groups (one per thread) from this many multiply-adds
#: per step (batch·out·in) and at least ``PAR_MIN_ROWS`` rows per group; below it a
#: parallel region costs more than it saves.
PAR_MIN_MACS = 1 << 22
PAR_MIN_ROWS = 64


@njit(cache=True, nogil=True)
def split_layer(B, o, i, parts):  # pragma: no cover - compiled
    """Row groups for a layer of ``o`` neurons: ``parts`` when worth it, else 1."""
    if parts < 2 or B * o * i < PAR_MIN_MACS:
        return 1
    return max(1, min(parts, o // PAR_MIN_ROWS))


@njit(cache=True, nogil=True)
def _rows(o, p, n):  # pragma: no cover - compiled
    return (o * p) // n, (o * (p + 1)) // n


@njit(cache=True, nogil=True, parallel=True)
def forward_groups_(prev, prev_fm, W, bvec, Z, fm, act, n):  # pragma: no cover - compiled
    """``layer_forward_`` for ``n`` row groups g of W in parallel.

    No reduction: each group owns its neurons of Z (rows when ``fm``, else
    columns), so the result is the same for any thread count given the same ``n``.
    """
    for p in prange(n):
        r0, r1 = _rows(W.shape[0], p, n)
        if fm:
            layer_forward_(prev, prev_fm, W[r0:r1], bvec[r0:r1], Z[r0:r1], fm, act)
        else:
            layer_forward_(prev, prev_fm, W[r0:r1], bvec[r0:r1], Z[:, r0:r1], fm, act)


@njit(cache=True, nogil=True, parallel=True)
def backward_groups_(
    dZ, fm, A, act, prev, prev_fm, W, dA, part, GW, Gb, mode, lr, n
):  # pragma: no cover - compiled
    """One layer's backward with its rows split into ``n`` groups in parallel.

    Group p reads its rows of the old W for its share of dA and then updates (or
    writes the gradient of) the same rows, so no group touches another's rows.
    The shares are partial sums over neurons: group 0 writes dA, group p > 0 its
    slice of ``part``, and they are added in group order after the parallel
    region, which keeps the result reproducible for a given ``n``. ``dA`` of size
    0 skips that product (the first layer).
    """
    R, C = dA.shape
    for p in prange(n):
        r0, r1 = _rows(W.shape[0], p, n)
        dst = dA if p == 0 else part[(p - 1) * R * C : p * R * C].reshape(R, C)
        if fm:
            layer_backward_(dZ[r0:r1], A[r0:r1], act, fm, prev, prev_fm, W[r0:r1], dst,
                            GW[r0:r1], Gb[r0:r1], mode, lr, part[:0])  # fmt: skip
        else:
            layer_backward_(dZ[:, r0:r1], A[:, r0:r1], act, fm, prev, prev_fm, W[r0:r1], dst,
                            GW[r0:r1], Gb[r0:r1], mode, lr, part[:0])  # fmt: skip
    if dA.size and n > 1:
        for r in prange(R):
            for p in range(1, n):
                src = part[(p - 1) * R * C + r * C : (p - 1) * R * C + (r + 1) * C]
                for k in range(C):
                    dA[r, k] += src[k]


@njit(cache=True, nogil=True)
def _forward_grouped(prev, prev_fm, W, bvec, Z, fm, act, B, parts):  # pragma: no cover
    """A layer's forward as neuron groups when it is big enough for ``parts``
    threads; False: it is not (the caller runs it whole)."""
    n = split_layer(B, W.shape[0], W.shape[1], parts)
    if n < 2:
        return False
    forward_groups_(prev, prev_fm, W, bvec, Z, fm, act, n)
    return True


@njit(cache=True, nogil=True)
def _backward_grouped(
    dZ, fm, A, act, prev, prev_fm, W, dA, part, GW, Gb, mode, lr, B, parts
):  # pragma: no cover - compiled
    """A layer's backward as neuron groups when it is big enough for ``parts``
    threads; False: it is not (the caller runs it whole)."""
    n = split_layer(B, W.shape[0], W.shape[1], parts)
    if n < 2:
        return False
    backward_groups_(dZ, fm, A, act, prev, prev_fm, W, dA, part, GW, Gb, mode, lr, n)
    return True


# -- the whole network ----------------------------------------------------------------


@njit(cache=True, nogil=True)
def forward(
    data, shapes, offs, acts, Xb, abuf, aoff, parts=None, XbT=None
):  # pragma: no cover - compiled
    """Fill every layer's activations (``abuf`` at ``aoff[l]``) for the batch ``Xb``.

    Hidden layers are stored ``[width, batch]``, the output ``[batch, out]``; the
    output is returned. ``parts`` is the number of threads a big layer's rows may
    be split over; None: one thread, and the neuron-group code is not compiled at
    all (numba prunes the branch on the argument's type): it was most of a cold
    start's compile (see ``train_loop``). ``XbT``: the same batch feature-major
    (``[in, batch]``, see ``_gather``); given, a hidden first layer reads it, as
    the plain product ``W·XbT`` is up to twice as fast in sgemm as ``W·Xbᵀ`` at
    small widths (issue 19).
    """
    B = Xb.shape[0]
    L = shapes.shape[0]
    for l in range(L):
        o, i = shapes[l, 0], shapes[l, 1]
        w0, b0 = offs[l, 0], offs[l, 1]
        W = data[w0 : w0 + o * i].reshape(o, i)
        fm = l < L - 1
        Z = abuf[aoff[l] : aoff[l] + B * o].reshape((o, B) if fm else (B, o))
        prev = Xb if l == 0 else abuf[aoff[l - 1] : aoff[l - 1] + B * i].reshape(i, B)
        prev_fm = l > 0
        if XbT is not None and l == 0 and fm:
            prev, prev_fm = XbT, True
        bvec = data[b0 : b0 + o]
        if parts is None or not _forward_grouped(prev, prev_fm, W, bvec, Z, fm, acts[l], B, parts):
            layer_forward_(prev, prev_fm, W, bvec, Z, fm, acts[l])
    K = shapes[L - 1, 0]
    return abuf[aoff[L - 1] : aoff[L - 1] + B * K].reshape(B, K)


@njit(cache=True, nogil=True)
def backward(
    data, shapes, offs, acts, Xb, abuf, aoff, D1, D2, G, mode, lr, parts, part, scratch
):  # pragma: no cover - compiled
    """Backpropagate ``dLoss/dout`` (the first ``B·K`` values of D1, ``[B, K]``).

    ``mode == MODE_GRAD`` writes the gradient into the flat ``G`` (same layout as
    ``data``); ``MODE_SGD`` applies ``data -= lr·grad`` as it goes and leaves G alone.
    D1 and D2 are ping-pong scratch of ``B·max(width)`` values; the deltas of
    hidden layers are ``[width, batch]`` like their activations. With ``parts > 1``
    big layers run as neuron groups (``backward_groups_``), which need ``part``:
    ``(parts - 1)·B·max(width)`` scratch values; ``parts`` None: one thread, the
    group code not compiled (as in ``forward``). ``scratch``: ``B·max(width)``
    values for ``weight_product_``, or empty.
    """
    B = Xb.shape[0]
    L = shapes.shape[0]
    cur, other = D1, D2
    for l in range(L - 1, -1, -1):
        o, i = shapes[l, 0], shapes[l, 1]
        w0, b0 = offs[l, 0], offs[l, 1]
        W = data[w0 : w0 + o * i].reshape(o, i)
        fm = l < L - 1
        dZ = cur[: B * o].reshape((o, B) if fm else (B, o))
        A = abuf[aoff[l] : aoff[l] + B * o].reshape((o, B) if fm else (B, o))
        prev = Xb if l == 0 else abuf[aoff[l - 1] : aoff[l - 1] + B * i].reshape(i, B)
        dA = other[: B * i if l > 0 else 0].reshape(i if l > 0 else 0, B)
        GW = G[w0 : w0 + o * i].reshape(o, i) if mode == MODE_GRAD else W
        Gb = G[b0 : b0 + o] if mode == MODE_GRAD else data[b0 : b0 + o]
        if parts is None or not _backward_grouped(
            dZ, fm, A, acts[l], prev, l > 0, W, dA, part, GW, Gb, mode, lr, B, parts
        ):
            layer_backward_(dZ, A, acts[l], fm, prev, l > 0, W, dA, GW, Gb, mode, lr, scratch)
        cur, other = other, cur


@njit(cache=True, nogil=True)
def _gather(X, idx, Xb, XbT=None):  # pragma: no cover - compiled
    # Explicit loops: numba's slice assignment costs seconds of compile time. XbT,
    # given: the batch feature-major as well ([in, batch], for forward).
    for r in range(Xb.shape[0]):
        src = idx[r]
        for k in range(Xb.shape[1]):
            Xb[r, k] = X[src, k]
            if XbT is not None:
                XbT[k, r] = X[src, k]


@njit(cache=True, nogil=True)
def _workspace(shapes, B, dtype_like):  # pragma: no cover - compiled
    L = shapes.shape[0]
    aoff = np.empty(L, np.int64)
    pos = 0
    widest = shapes[0, 1]
    for l in range(L):
        aoff[l] = pos
        pos += B * shapes[l, 0]
        widest = max(widest, shapes[l, 0])
    abuf = np.empty(pos, dtype_like.dtype)
    D1 = np.empty(B * widest, dtype_like.dtype)
    D2 = np.empty(B * widest, dtype_like.dtype)
    Xb = np.empty((B, shapes[0, 1]), dtype_like.dtype)
    return aoff, abuf, D1, D2, Xb


@njit(cache=True, nogil=True)
def loss_and_grad(data, shapes, offs, acts, loss, X, T, labels, G):  # pragma: no cover
    """Mean loss over all rows of X; the gradient goes into G (same layout as data)."""
    n = X.shape[0]
    idx = np.arange(n)
    aoff, abuf, D1, D2, Xb = _workspace(shapes, n, data)
    _gather(X, idx, Xb)
    out = forward(data, shapes, offs, acts, Xb, abuf, aoff)
    value = loss_grad_(out, loss, T, labels, idx, D1[: out.size].reshape(out.shape))
    scratch = np.empty(D1.shape[0], data.dtype)
    backward(
        data, shapes, offs, acts, Xb, abuf, aoff, D1, D2, G, MODE_GRAD, 0.0, None, D1[:0], scratch
    )
    return value


@njit(cache=True, nogil=True)
def predict_rows(data, shapes, offs, acts, X, out):  # pragma: no cover - compiled
    """Output activations for every row of X into ``out``, in blocks of 256 rows."""
    n = X.shape[0]
    for s in range(0, n, 256):
        e = min(n, s + 256)
        aoff, abuf, _, _, Xb = _workspace(shapes, e - s, data)
        _gather(X, np.arange(s, e), Xb)
        res = forward(data, shapes, offs, acts, Xb, abuf, aoff)
        for r in range(e - s):
            for j in range(res.shape[1]):
                out[s + r, j] = res[r, j]


@njit(cache=True, nogil=True)
def optimizer_update_(
    data, G, opt, lr, mu, nesterov, b1, b2, eps, t, buf1, buf2
):  # pragma: no cover
    """One elementwise update from the gradient G (torch's formulas).

    momentum: ``v = mu·v + g``; ``p -= lr·(g + mu·v)`` (Nesterov) or ``lr·v``.
    adam (step ``t`` from 1): ``m, v`` moments; ``p -= lr/bc1 · m / (√v/√bc2 + eps)``.
    """
    n = data.shape[0]
    if opt == _SGD:
        for k in range(n):
            data[k] -= lr * G[k]
    elif opt == _MOMENTUM:
        for k in range(n):
            v = mu * buf1[k] + G[k]
            buf1[k] = v
            data[k] -= lr * (G[k] + mu * v) if nesterov else lr * v
    else:
        bc1 = 1.0 - b1**t
        bc2 = math.sqrt(1.0 - b2**t)
        step = lr / bc1
        for k in range(n):
            g = G[k]
            m = b1 * buf1[k] + (1 - b1) * g
            v = b2 * buf2[k] + (1 - b2) * g * g
            buf1[k] = m
            buf2[k] = v
            data[k] -= step * m / (np.sqrt(v) / bc2 + eps)


@njit(cache=True, nogil=True)
def train_loop(  # pragma: no cover - compiled
    data, shapes, offs, acts, loss, X, T, labels, idx, batch,
    opt, lr, mu, nesterov, b1, b2, eps, t0, buf1, buf2, G, losses, parts,
):  # fmt: skip
    """``len(losses)`` train steps; step s uses rows ``idx[s·batch:(s+1)·batch]``.

    ``t0`` is the optimizer's step count before the call (Adam's bias correction).
    ``losses[s]`` receives step s's mean batch loss, measured before its update.
    ``parts`` threads may share a big layer's rows (neuron groups); the caller
    keeps BLAS single-threaded then (``nn.blas.sgemm_threads``). ``parts`` None:
    one thread, and the group code is not compiled (a cold start compiles this
    loop in 11-16 s on the 2-core VM instead of ~44 s, docs/performance.md).
    """
    aoff, abuf, D1, D2, Xb = _workspace(shapes, batch, data)
    XbT = np.empty((Xb.shape[1], batch), data.dtype)
    part = D1[:0] if parts is None else np.empty((max(parts, 1) - 1) * D1.shape[0], data.dtype)
    scratch = np.empty(D1.shape[0], data.dtype)
    K = shapes[shapes.shape[0] - 1, 0]
    # One call of backward with a run-time mode: two calls with the constants
    # MODE_SGD and MODE_GRAD compiled it twice (numba types them as literals).
    mode = MODE_SGD if opt == _SGD else MODE_GRAD
    step_lr = lr if opt == _SGD else 0.0
    for s in range(losses.shape[0]):
        bidx = idx[s * batch : (s + 1) * batch]
        _gather(X, bidx, Xb, XbT)
        out = forward(data, shapes, offs, acts, Xb, abuf, aoff, parts, XbT)
        losses[s] = loss_grad_(out, loss, T, labels, bidx, D1[: batch * K].reshape(batch, K))
        backward(
            data, shapes, offs, acts, Xb, abuf, aoff, D1, D2, G, mode, step_lr, parts, part, scratch
        )
        if opt != _SGD:
            optimizer_update_(data, G, opt, lr, mu, nesterov, b1, b2, eps, t0 + s + 1, buf1, buf2)
