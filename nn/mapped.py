"""Parameters in a memory-mapped file: a model as big as the machine's memory.

The extreme preset has 2.1 B parameters, 8.6 GB as float32: one copy fits a
24 GB machine, two do not comfortably, and ``ModelSpec.init_params`` refuses to
allocate it. Here the ``Params`` buffer is an ``np.memmap`` of a file in Params
layout order (raw little-endian float32, nothing else), so the coordinator works
on the file's pages: the kernel keeps the hot ones in memory, writes dirty ones
back, and never holds a second copy. Version 0 is written layer by layer from
the same generators as ``init_params`` (same bits for any model small enough to
have both), with no temporary the size of a layer.

Sub-model tasks (nn/subnet.py) are what make such a model trainable: each task
reads and writes a slice, so a merge touches its subnet's pages, not the model.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from nn.params import Params
from nn.rng import Xoshiro128ss
from nn.spec import ModelSpec

#: models above this many parameters (``init_params``' limit) live in a mapped file
MAP_ABOVE_PARAMS = 2**31

#: rows of a weight matrix initialised per call (bounds the generator's working set)
_ROWS_PER_FILL = 1024


def create_mapped(path: str | Path, spec: ModelSpec, seed: int) -> Params:
    """A new file at ``path`` holding version 0 of ``spec`` (the portable
    ``x128ss-ih12`` init of ``seed``: He or Xavier weights, zero biases)."""
    p = Path(path)
    n = spec.num_params
    with open(p, "wb") as f:  # a sparse file of zeros: the biases are already right
        f.truncate(4 * n)
    params = open_mapped(p, spec)
    for layer, W in enumerate(params.W):
        gen = Xoshiro128ss(seed, layer)
        std = spec.init_std(layer)
        for r0 in range(0, W.shape[0], _ROWS_PER_FILL):  # one stream, in row order
            block = W[r0 : r0 + _ROWS_PER_FILL]
            gen.normal_into(block.reshape(-1), std)
    params.data.flush()
    return params


def open_mapped(path: str | Path, spec: ModelSpec, *, writable: bool = True) -> Params:
    """The parameters in ``path`` (as written by ``create_mapped`` or a flush)."""
    p = Path(path)
    n = spec.num_params
    size = os.path.getsize(p)
    if size != 4 * n:
        raise ValueError(
            f"{p}: {size:,} bytes, a {list(spec.widths)} model needs {4 * n:,} (float32)"
        )
    data = np.memmap(p, dtype="<f4", mode="r+" if writable else "r", shape=(n,))
    return Params(spec, data)
