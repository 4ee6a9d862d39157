"""Layer-split training: an MLP cut between layers into blocks, each on a local loss.

``cuts`` are hidden-layer indices: ``cuts = (c,)`` cuts ``widths`` at ``widths[c]``, so block 0
holds layers ``[0, c)`` and block 1 layers ``[c, L)``; the activations at a cut (after its
ReLU) are the block's *boundary*. Each block trains on a loss of its own (decoupled greedy
learning, DGL): a block that is not the last carries an auxiliary linear head from its boundary
to the classes and steps on the real loss through it; the last block is the network's own top.
Per mini-batch, block k computes its boundary *before* its own step (detached: no gradient
crosses a cut) and hands it, with the labels, to block k+1: nothing comes back but an ack.

A block's training model is an ordinary MLP (its layers, then the aux head) that
``nn.train.train_steps`` trains unchanged; its own weights are a prefix of that buffer
(``BlockTrainer.block_params`` is a view, no copy), and ``join_params`` joins the prefixes into
the whole network's ``Params``. Everything is seeded: the layers from ``spec.init_params(seed)``,
aux head k from ``Xoshiro128ss(seed, AUX_STREAM + k)``, the batch order from
``Xoshiro128ss(seed, BATCH_STREAM)`` as in ``train_whole``; with no cut ``train_split`` is
``train_whole`` bit for bit. Why DGL and not the seed's ADMM, and the figures:
docs/simulations.md ("Layer-split training") and docs/decisions.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise

import numpy as np

from nn.optim import Optimizer, OptState
from nn.params import Params
from nn.rng import Xoshiro128ss
from nn.spec import ModelSpec
from nn.train import forward_outputs, train_steps

#: Generator streams (``nn.rng``): layer l's init uses stream l, far below these.
AUX_STREAM = 1 << 20
BATCH_STREAM = 1 << 21


class _InOrder:
    """A Permuter that keeps a batch's rows in order: batches are drawn here, once
    per epoch, so every block sees its rows in the same order."""

    def permutation(self, n: int, /) -> np.ndarray:
        return np.arange(n)


_IN_ORDER = _InOrder()


def check_cuts(spec: ModelSpec, cuts: Sequence[int]) -> tuple[int, ...]:
    """Cuts as a tuple of strictly increasing hidden-layer indices in ``1..L-1``."""
    out = tuple(int(c) for c in cuts)
    L = spec.num_layers
    if any(not 1 <= c <= L - 1 for c in out) or any(a >= b for a, b in pairwise(out)):
        raise ValueError(
            f"cuts: need strictly increasing layer indices in 1..{L - 1} "
            f"(between the {L} layers of {list(spec.widths)}), got {list(out)}"
        )
    return out


def _bounds(spec: ModelSpec, cuts: Sequence[int]) -> list[tuple[int, int]]:
    edges = (0, *check_cuts(spec, cuts), spec.num_layers)
    return list(pairwise(edges))


def split_spec(spec: ModelSpec, cuts: Sequence[int]) -> list[ModelSpec]:
    """One spec per block: its widths and activations (a block that is not the
    last ends in its hidden activation; its ``loss`` is then unused)."""
    return [
        ModelSpec(
            widths=spec.widths[a : b + 1],
            activations=spec.activations[a:b],
            loss=spec.loss,
            init=spec.init,
        )
        for a, b in _bounds(spec, cuts)
    ]


def train_spec(spec: ModelSpec, cuts: Sequence[int], k: int) -> ModelSpec:
    """What block ``k`` trains: its layers plus a linear aux head to the classes,
    or, for the last block, its layers alone (the network's own head)."""
    blocks = split_spec(spec, cuts)
    block = blocks[k]
    if k == len(blocks) - 1:
        return block
    return ModelSpec(
        widths=(*block.widths, spec.widths[-1]),
        activations=(*block.activations, spec.activations[-1]),
        loss=spec.loss,
        init=spec.init,
    )


def split_params(params: Params, cuts: Sequence[int]) -> list[Params]:
    """The whole network's weights as one Params per block (copies)."""
    spec = params.spec
    return [
        Params.from_layers(block, params.layers[a:b])
        for block, (a, b) in zip(split_spec(spec, cuts), _bounds(spec, cuts), strict=True)
    ]


def join_params(spec: ModelSpec, blocks: Sequence[Params]) -> Params:
    """Inverse of ``split_params``: the blocks' layers, in order, as ``spec``'s Params."""
    widths: list[int] = []
    for p in blocks:
        if widths and widths[-1] != p.spec.widths[0]:
            raise ValueError(
                f"join: a block of input width {p.spec.widths[0]} follows width {widths[-1]}"
            )
        widths += p.spec.widths[1:] if widths else p.spec.widths
    if tuple(widths) != spec.widths:
        raise ValueError(f"join: the blocks' widths {widths} are not {list(spec.widths)}")
    return Params(spec, np.concatenate([p.data for p in blocks]).astype(np.float32, copy=False))


class BlockTrainer:
    """One block, its aux head (unless last), and its optimizer state.

    Call order per mini-batch: ``boundary(X)`` (not for the last block), then
    ``step(X, y)``; DGL hands on the boundary from before the step.
    ``forward_and_step`` does both.
    """

    __slots__ = ("block", "index", "opt_state", "params", "spec")

    def __init__(
        self, *, block: ModelSpec, spec: ModelSpec, params: Params, index: int, optimizer: Optimizer
    ) -> None:
        self.block = block
        self.spec = spec
        self.params = params
        self.index = index
        self.opt_state = OptState.init(optimizer, spec)

    @property
    def is_last(self) -> bool:
        """No aux head: this block's loss is the network's own."""
        return self.spec.num_layers == self.block.num_layers

    @property
    def block_params(self) -> Params:
        """The block's own layers: a view of the prefix of ``params`` (no aux head)."""
        return Params(self.block, self.params.data[: self.block.num_params])

    def boundary(self, X: np.ndarray) -> np.ndarray:
        """The block's output activations for X, ``[n, boundary width]`` float32."""
        return forward_outputs(self.block_params, X)

    def step(self, X: np.ndarray, y: np.ndarray) -> float:
        """One optimizer step on the whole batch (X, y); returns its loss before the step."""
        return train_steps(self.params, self.opt_state, X, y, 1, len(X), _IN_ORDER).loss

    def forward_and_step(self, X: np.ndarray, y: np.ndarray) -> np.ndarray | None:
        """The boundary for X (None for the last block), then a step on (X, y)."""
        h = None if self.is_last else self.boundary(X)
        self.step(X, y)
        return h


def boundary_of(params: Params, cut: int, X: np.ndarray) -> np.ndarray:
    """The activations of hidden layer ``cut`` of ``params`` for X, ``[n, width]``
    float32: its first ``cut`` layers' forward pass (a layer-split lower task's
    boundary, docs/protocol.md §3.3.2)."""
    spec = params.spec
    if not 1 <= cut < spec.num_layers:
        raise ValueError(f"cut: a hidden layer 1..{spec.num_layers - 1}, got {cut}")
    block = ModelSpec(
        widths=spec.widths[: cut + 1],
        activations=spec.activations[:cut],
        loss=spec.loss,
        init=spec.init,
    )
    return forward_outputs(Params(block, params.data[: block.num_params]), X)


def init_blocks(
    spec: ModelSpec, cuts: Sequence[int], *, seed: int, optimizer: Optimizer
) -> list[BlockTrainer]:
    """Blocks starting from the whole network's ``init_params(seed)``; aux heads
    from their own streams with the spec's init scale, biases zero."""
    whole = spec.init_params(seed)
    blocks = split_spec(spec, cuts)
    out = []
    for k, (block, part) in enumerate(zip(blocks, split_params(whole, cuts), strict=True)):
        tspec = block if k == len(blocks) - 1 else train_spec(spec, cuts, k)
        params = Params.zeros(tspec)
        params.data[: block.num_params] = part.data
        if tspec is not block:
            head = tspec.num_layers - 1
            Xoshiro128ss(seed, AUX_STREAM + k).normal_into(
                params.W[head].reshape(-1), tspec.init_std(head)
            )
        out.append(
            BlockTrainer(block=block, spec=tspec, params=params, index=k, optimizer=optimizer)
        )
    return out


def epoch_batches(n: int, batch: int, rng: Xoshiro128ss) -> list[np.ndarray]:
    """One epoch's row indices: a permutation cut into ``n // batch`` full batches
    (one of ``n`` rows when ``n < batch``).

    The remainder is dropped, a fresh one each epoch: a step on a few rows at
    the lr of a full batch is a large noisy step, and with it at the end of
    every epoch digits' test accuracy swung by up to 20 points between epochs.
    """
    if batch < 1 or n < 1:
        raise ValueError(f"epoch: need n >= 1 and batch >= 1, got n={n}, batch={batch}")
    perm = rng.permutation(n).astype(np.int64)
    size = min(batch, n)
    return [perm[i : i + size] for i in range(0, n - size + 1, size)]


def batch_sizes(n: int, batch: int) -> list[int]:
    """The sizes ``epoch_batches`` cuts an epoch into (what a block that does not
    hold the data needs to know to split what it receives)."""
    size = min(batch, n)
    return [size] * (n // size)


EpochHook = Callable[[int, list[BlockTrainer]], None]


def train_split(
    spec: ModelSpec,
    cuts: Sequence[int],
    X: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    batch: int,
    optimizer: Optimizer,
    seed: int,
    on_epoch: EpochHook | None = None,
) -> list[BlockTrainer]:
    """DGL in one process: each batch goes up the blocks, each steps on its loss.

    The reference the simulation (simulations/layersplit.py) must reproduce
    exactly when its frames are lossless (fp32).
    """
    blocks = init_blocks(spec, cuts, seed=seed, optimizer=optimizer)
    rng = Xoshiro128ss(seed, BATCH_STREAM)
    for e in range(epochs):
        for idx in epoch_batches(len(X), batch, rng):
            h, yb = X[idx], y[idx]
            for b in blocks:
                h = b.forward_and_step(h, yb)
        if on_epoch is not None:
            on_epoch(e, blocks)
    return blocks


def train_whole(
    spec: ModelSpec,
    X: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    batch: int,
    optimizer: Optimizer,
    seed: int,
) -> Params:
    """The baseline: the same network, init, batches and optimizer, by backprop.

    Written without the block machinery on purpose: ``train_split`` with no cut
    must equal it bit for bit, which tests the splitting, not a tautology.
    """
    params = spec.init_params(seed)
    opt_state = OptState.init(optimizer, spec)
    rng = Xoshiro128ss(seed, BATCH_STREAM)
    for _ in range(epochs):
        for idx in epoch_batches(len(X), batch, rng):
            train_steps(params, opt_state, X[idx], y[idx], 1, len(idx), _IN_ORDER)
    return params


def joined(spec: ModelSpec, blocks: Sequence[BlockTrainer]) -> Params:
    """The network the blocks make together (aux heads dropped), as one Params."""
    return join_params(spec, [b.block_params for b in blocks])
