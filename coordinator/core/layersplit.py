"""Layer-split jobs: the model cut at one hidden layer, each block trained by tasks.

A job with ``[split] cut = c`` trains the network as two blocks on the decoupled local losses
of nn/layersplit.py; no gradient crosses the cut, so each block is trained by ordinary,
independent tasks (docs/protocol.md §3.3.2):

- a **lower task** is a train task on the lower block plus its head (``train_spec(spec, (c,),
  0)``) over one of the job's shards; with ``task.boundary = c`` its result also carries the
  boundary activations of the shard's rows under the block it trained;
- those activations and the shard's labels become a **boundary shard**, a shard file named by
  its hash and served like the job's own (§13), and an **upper task** is a train task on the
  upper block (``widths[c:]``) over it.

The coordinator keeps the whole network (evaluated, checkpointed and exported as one model: the
joined blocks) and, beside it, the lower block's auxiliary head, which is the strategy's state
(checkpointed with it). Boundary shards waiting for an upper task are not: after a restart,
lower tasks make new ones. Theory, and how this differs from the simulator's online DGL:
docs/coordinator.md ("Layer-split jobs").
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from coordinator.core.config import SplitSection
from coordinator.core.data import DataCatalog, ShardBlob
from nn.layersplit import AUX_STREAM, split_spec, train_spec
from nn.params import Params
from nn.rng import Xoshiro128ss
from nn.spec import ModelSpec
from protocol.chunking import Block, Layout, params_layout
from protocol.shardfile import encode_shard, sha256_hex

LOWER, UPPER = 0, 1
#: the key of the boundary activations' norm check (beside each block's)
BOUNDARY = 2
#: boundary shards' indices start here, far above any job's own shards
BOUNDARY_BASE = 1 << 30
#: the boundary's block in a lower result's layout: ``(L, "h")``, L = layers
BOUNDARY_PART = "h"


class SplitBlocks:
    """The two blocks' specs and parameters: views of the whole model, plus the
    lower block's auxiliary head (initialised as nn/layersplit.py does)."""

    __slots__ = ("aux", "cut", "lower", "n_lower", "spec", "upper", "width")

    def __init__(self, spec: ModelSpec, cut: int, *, init_seed: int) -> None:
        self.spec = spec
        self.cut = cut
        #: the lower block and its head: what a lower task trains
        self.lower = train_spec(spec, (cut,), LOWER)
        below, self.upper = split_spec(spec, (cut,))
        #: the lower block's values: a prefix of the whole model's buffer
        self.n_lower = below.num_params
        self.width = spec.widths[cut]
        head = Params.zeros(self.lower)
        last = self.lower.num_layers - 1
        Xoshiro128ss(init_seed, AUX_STREAM + LOWER).normal_into(
            head.W[last].reshape(-1), self.lower.init_std(last)
        )
        #: the auxiliary head's W and b, flat (the tail of a lower task's model)
        self.aux = head.data[self.n_lower :].copy()

    def spec_of(self, block: int) -> ModelSpec:
        return self.lower if block == LOWER else self.upper

    def slice(self, block: int, params: Params) -> Params:
        """What a task on ``block`` trains: the lower block with its head (a copy),
        or the upper block (a view of ``params``)."""
        if block == LOWER:
            return Params(self.lower, np.concatenate([params.data[: self.n_lower], self.aux]))
        return Params(self.upper, params.data[self.n_lower :])

    def merge(self, block: int, params: Params, update: np.ndarray, scale: float) -> None:
        """``block += scale · update`` (the head's share of a lower update too)."""
        s = np.float32(scale)
        if block == LOWER:
            params.data[: self.n_lower] += s * update[: self.n_lower]
            self.aux += s * update[self.n_lower :]
        else:
            params.data[self.n_lower :] += s * update

    def result_layout(self, block: int, rows: int) -> Layout:
        """A result's chunk layout: the block's update, and after a lower block's
        the boundary of its ``rows`` rows as block ``(L, "h")``."""
        spec = self.spec_of(block)
        layout = params_layout(spec)
        if block == UPPER:
            return layout
        return (*layout, Block(spec.num_layers, BOUNDARY_PART, (rows, self.width)))


#: shards no longer leased but still served, for a client that fetches late
RETIRED_KEPT = 64


class Boundaries:
    """Boundary shards waiting for, or leased to, upper tasks (oldest first).

    One upper task trains each; a shard whose task lost its lease waits again, so
    it is trained even when its first client leaves. At most ``waiting`` shards
    wait unleased: one more pushes the oldest out (the stalest activations). A
    shard that leaves (trained, or pushed out) is still served for a while (the
    last ``RETIRED_KEPT``): a client whose lease ran out, or who reconnected, may
    still fetch it for the task it holds, and a fetch of an unknown shard closes
    the connection (§13.1)."""

    __slots__ = (
        "_catalog",
        "_classes",
        "_labels",
        "_leased",
        "_next",
        "_retired",
        "_waiting",
        "limit",
    )

    def __init__(self, config: SplitSection, catalog: DataCatalog, labels: np.ndarray, *,
                 classes: int) -> None:  # fmt: skip
        self.limit = config.waiting
        self._catalog = catalog
        #: the training split's labels (a shard's are ``labels[catalog.indices[i]]``)
        self._labels = labels
        self._classes = classes
        self._waiting: OrderedDict[int, None] = OrderedDict()
        self._leased: set[int] = set()
        self._retired: OrderedDict[int, None] = OrderedDict()
        self._next = BOUNDARY_BASE

    def add(self, shard: int, h: np.ndarray) -> ShardBlob:
        """A lower result's boundary for the rows of job shard ``shard``."""
        y = self._labels[self._catalog.indices[shard]]
        blob = encode_shard(h, y, classes=self._classes)
        made = ShardBlob(self._next, sha256_hex(blob), blob, int(h.shape[0]))
        self._next += 1
        self._catalog.add(made)
        self._waiting[made.index] = None
        while len(self._waiting) > self.limit:
            old, _ = self._waiting.popitem(last=False)
            self._retire(old)
        return made

    def _retire(self, index: int) -> None:
        """No longer leased, still served a while (see the class docstring)."""
        self._retired[index] = None
        while len(self._retired) > RETIRED_KEPT:
            gone, _ = self._retired.popitem(last=False)
            self._catalog.discard(gone)

    def take(self) -> int | None:
        """The oldest waiting shard, now leased (None: none waits)."""
        if not self._waiting:
            return None
        index, _ = self._waiting.popitem(last=False)
        self._leased.add(index)
        return index

    def trained(self, index: int) -> None:
        """Its upper task's result went in: the shard is leased no more."""
        if index in self._retired:  # a late second result for it
            return
        self._leased.discard(index)
        self._waiting.pop(index, None)
        self._retire(index)

    def lost(self, index: int) -> None:
        """Its upper task lost its lease: the shard waits for another (first)."""
        if index in self._leased:
            self._leased.discard(index)
            self._waiting[index] = None
            self._waiting.move_to_end(index, last=False)

    def __len__(self) -> int:
        return len(self._waiting) + len(self._leased)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def is_boundary(self, shard: int) -> bool:
        return shard >= BOUNDARY_BASE
