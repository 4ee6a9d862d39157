"""Pruning a trained model: unstructured (zero weights) and structured (drop neurons).

Unstructured magnitude pruning zeroes the smallest weights of each layer to a
target sparsity; the shapes stay, so it pays off only with a sparse format or a
sparse codec, and fine-tuning must keep the zeros (a mask re-applied after every
step, i.e. projected SGD). Structured pruning removes whole hidden neurons — a
row of ``W[l]``, its bias, and the matching column of ``W[l+1]`` — so the widths
really shrink and every runtime gets faster without sparse kernels. A neuron's
score is ``‖W[l][j,:]‖ · ‖W[l+1][:,j]‖``: what flows in times what flows out.
Biases are never pruned (they are few and cheap) and neither is the output layer.
"""

from __future__ import annotations

import numpy as np

from nn.optim import Optimizer, OptState
from nn.params import Params
from nn.spec import ModelSpec
from nn.train import TrainMetrics, train_steps


def _check_fraction(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise ValueError(f"{what}: must be a fraction in [0, 1), got {value!r}")
    return float(value)


def magnitude_masks(params: Params, sparsity: float) -> list[np.ndarray]:
    """Per layer, a bool mask of the W entries to keep: the largest ``1 − sparsity``."""
    sparsity = _check_fraction(sparsity, "sparsity")
    masks = []
    for W in params.W:
        flat = np.abs(W).reshape(-1)
        drop = round(sparsity * flat.size)
        mask = np.ones(flat.size, bool)
        if drop:
            mask[np.argpartition(flat, drop - 1)[:drop]] = False
        masks.append(mask.reshape(W.shape))
    return masks


def apply_masks_(params: Params, masks: list[np.ndarray]) -> Params:
    """Zero the pruned weights in place; returns params for chaining."""
    if len(masks) != params.spec.num_layers:
        raise ValueError(f"masks: need {params.spec.num_layers} layers, got {len(masks)}")
    for li, (W, m) in enumerate(zip(params.W, masks, strict=True)):
        if m.shape != W.shape or m.dtype != bool:
            raise ValueError(f"masks[{li}]: need a bool array of shape {W.shape}, got {m.shape}")
        W[~m] = 0.0
    return params


def magnitude_prune(params: Params, sparsity: float) -> tuple[Params, list[np.ndarray]]:
    """A copy of ``params`` with each layer's smallest weights zeroed, and the masks."""
    masks = magnitude_masks(params, sparsity)
    return apply_masks_(params.copy(), masks), masks


def sparsity_of(params: Params) -> float:
    """Fraction of W entries that are exactly zero (biases not counted)."""
    total = sum(W.size for W in params.W)
    zeros = sum(int(np.count_nonzero(W == 0)) for W in params.W)
    return zeros / total if total else 0.0


def neuron_scores(params: Params, layer: int) -> np.ndarray:
    """Score of each neuron of hidden layer ``layer``: in-norm times out-norm."""
    if not 0 <= layer < params.spec.num_layers - 1:
        raise ValueError(f"layer: {layer} is not a hidden layer (0..{params.spec.num_layers - 2})")
    w_in = np.linalg.norm(params.W[layer], axis=1)
    w_out = np.linalg.norm(params.W[layer + 1], axis=0)
    return w_in * w_out


def prune_neurons(
    params: Params, fraction: float, *, layers: list[int] | None = None
) -> tuple[Params, list[np.ndarray]]:
    """Remove ``fraction`` of the neurons of each hidden layer (lowest scores first).

    Returns a new, smaller Params and per hidden layer the kept neuron indices
    (ascending, so the surviving neurons keep their order). At least one neuron
    of every layer survives.
    """
    fraction = _check_fraction(fraction, "fraction")
    spec = params.spec
    hidden = list(range(spec.num_layers - 1))
    chosen = hidden if layers is None else layers
    for li in chosen:
        if li not in hidden:
            raise ValueError(f"layers: {li} is not a hidden layer (0..{spec.num_layers - 2})")
    keep: list[np.ndarray] = []
    for li in hidden:
        width = spec.widths[li + 1]
        if li in chosen:
            n_keep = max(1, width - round(fraction * width))
            order = np.argsort(-neuron_scores(params, li), kind="stable")
            keep.append(np.sort(order[:n_keep]))
        else:
            keep.append(np.arange(width))
    widths = (spec.widths[0], *(len(k) for k in keep), spec.widths[-1])
    new_spec = ModelSpec(
        widths=widths, activations=spec.activations, loss=spec.loss, init=spec.init
    )
    layers_out = []
    for li, (W, b) in enumerate(params.layers):
        rows = keep[li] if li < len(keep) else np.arange(W.shape[0])
        cols = keep[li - 1] if li > 0 else np.arange(W.shape[1])
        layers_out.append((W[np.ix_(rows, cols)], b[rows]))
    return Params.from_layers(new_spec, layers_out), keep


def finetune(
    params: Params,
    X: np.ndarray,
    y: np.ndarray,
    *,
    steps: int,
    batch: int = 32,
    optimizer: Optimizer | None = None,
    rng: np.random.Generator,
    masks: list[np.ndarray] | None = None,
) -> TrainMetrics | None:
    """Train ``steps`` steps in place; with ``masks``, pruned weights stay zero.

    The masks are re-applied after every step, which makes it projected SGD: the
    pruned weights never drift back, so the sparsity reported is the one shipped.
    """
    if steps == 0:
        return None
    opt = optimizer or Optimizer(kind="momentum", lr=0.02, momentum=0.9)
    state = OptState.init(opt, params.spec)
    if masks is None:
        return train_steps(params, state, X, y, steps, batch, rng)
    losses = []
    for _ in range(steps):
        m = train_steps(params, state, X, y, 1, batch, rng)
        apply_masks_(params, masks)
        losses.append(m.loss)
    return TrainMetrics(
        steps=steps, samples=steps * batch, loss=float(np.mean(losses)), last_loss=losses[-1]
    )
