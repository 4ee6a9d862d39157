"""The readable specification of the MLP: plain numpy, the oracle the numba
kernels (nn/kernels.py, nn/train.py) are held to by tests/nn.

Written for clarity, not speed: per-layer lists of arrays, the textbook forward
and backward pass, and the optimizers as separate functions, so that what the
fast path computes can be read here in a page (micrograd's virtue, kept beside
the fast path). Generic over dtype, so the finite-difference checks run in
float64. docs/protocol.md §12 states the same arithmetic for other languages.
"""

from __future__ import annotations

import numpy as np


def act(name: str, z: np.ndarray) -> np.ndarray:
    if name == "relu":
        return np.maximum(z, 0)
    if name == "tanh":
        return np.tanh(z)
    if name == "sigmoid":
        return 1 / (1 + np.exp(-z))
    if name == "identity":
        return z
    raise ValueError(name)


def act_grad(name: str, a: np.ndarray) -> np.ndarray:
    """Derivative as a function of the activation's output."""
    if name == "relu":
        return (a > 0).astype(a.dtype)
    if name == "tanh":
        return 1 - a * a
    if name == "sigmoid":
        return a * (1 - a)
    return np.ones_like(a)


def forward(Ws, bs, acts, X):
    """All activations, input first."""
    A = [X]
    for W, b, a in zip(Ws, bs, acts, strict=True):
        A.append(act(a, A[-1] @ W.T + b))
    return A


def loss_and_dout(loss: str, out: np.ndarray, y: np.ndarray):
    B, K = out.shape
    if loss == "mse":
        e = out - y
        return float((e.astype(np.float64) ** 2).mean()), 2 * e / (B * K)
    z = out - out.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    value = float(-np.log(p[np.arange(B), y].astype(np.float64)).mean())
    d = p.copy()
    d[np.arange(B), y] -= 1
    return value, d / B


def loss_and_grad(Ws, bs, acts, loss, X, y):
    """Mean loss and per-layer gradients ``(dWs, dbs)``."""
    A = forward(Ws, bs, acts, X)
    value, d = loss_and_dout(loss, A[-1], y)
    dWs, dbs = [None] * len(Ws), [None] * len(Ws)
    for l in range(len(Ws) - 1, -1, -1):
        dz = d * act_grad(acts[l], A[l + 1])
        dWs[l] = dz.T @ A[l]
        dbs[l] = dz.sum(axis=0)
        d = dz @ Ws[l]
    return value, dWs, dbs


def loss_only(Ws, bs, acts, loss, X, y) -> float:
    out = forward(Ws, bs, acts, X)[-1]
    return loss_and_dout(loss, out, y)[0]


class RefOptimizer:
    """torch's SGD (with momentum / Nesterov) and Adam, on lists of arrays."""

    def __init__(self, kind, lr, momentum=0.9, nesterov=False, beta1=0.9, beta2=0.999, eps=1e-8):
        self.kind, self.lr, self.mu, self.nesterov = kind, lr, momentum, nesterov
        self.b1, self.b2, self.eps = beta1, beta2, eps
        self.t = 0
        self.state: dict[int, tuple] = {}

    def update(self, params: list[np.ndarray], grads: list[np.ndarray]) -> None:
        self.t += 1
        for i, (p, g) in enumerate(zip(params, grads, strict=True)):
            if self.kind == "sgd":
                p -= self.lr * g
            elif self.kind == "momentum":
                v = self.state.get(i, (np.zeros_like(p),))[0]
                v = self.mu * v + g
                self.state[i] = (v,)
                p -= self.lr * (g + self.mu * v) if self.nesterov else self.lr * v
            else:
                m, v = self.state.get(i, (np.zeros_like(p), np.zeros_like(p)))
                m = self.b1 * m + (1 - self.b1) * g
                v = self.b2 * v + (1 - self.b2) * g * g
                self.state[i] = (m, v)
                bc1 = 1 - self.b1**self.t
                bc2 = np.sqrt(1 - self.b2**self.t)
                p -= (self.lr / bc1) * m / (np.sqrt(v) / bc2 + self.eps)


def train(Ws, bs, acts, loss, X, y, idx, batch, opt: RefOptimizer) -> list[float]:
    """Steps over consecutive ``batch``-sized slices of ``idx``; updates in place."""
    losses = []
    for s in range(len(idx) // batch):
        rows = idx[s * batch : (s + 1) * batch]
        value, dWs, dbs = loss_and_grad(Ws, bs, acts, loss, X[rows], y[rows])
        losses.append(value)
        opt.update([*Ws, *bs], [*dWs, *dbs])
    return losses


def train_steps_per_second(Ws, bs, X, y, batch: int, steps: int) -> None:
    """ReLU + MSE + SGD steps for the benchmark (lr 1e-3), on in-order batches."""
    for s in range(steps):
        r0 = (s * batch) % (len(X) - batch + 1)
        xb, yb = X[r0 : r0 + batch], y[r0 : r0 + batch]
        A = [xb]
        for l, (W, b) in enumerate(zip(Ws, bs, strict=True)):
            z = A[-1] @ W.T + b
            A.append(np.maximum(z, 0) if l < len(Ws) - 1 else z)
        d = 2 * (A[-1] - yb) / A[-1].size
        for l in range(len(Ws) - 1, -1, -1):
            if l < len(Ws) - 1:
                d = d * (A[l + 1] > 0)
            dW = d.T @ A[l]
            db = d.sum(axis=0)
            if l > 0:
                d = d @ Ws[l]
            Ws[l] -= 1e-3 * dW
            bs[l] -= 1e-3 * db
