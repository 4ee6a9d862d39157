"""Which neuron rows of a model changed: what an incremental checkpoint rewrites.

A sub-model merge (nn/subnet.py ``Subnet.add_to``) moves only its subnet's rows,
so on a model trained by sub-model tasks most neuron groups are the same from
one checkpoint to the next, and storage (storage/layout.py ``ParamsPatch``) can
write only the groups that hold a changed row. A step that says nothing about
where it moved the model marks every row: a missed mark would make a checkpoint
silently keep stale bytes, a spurious one only costs a write.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nn.params import NeuronGroup
from nn.spec import ModelSpec
from nn.subnet import Subnet


class ChangedRows:
    """Rows changed per layer since the last ``take`` (all of them at first:
    nothing is stored yet)."""

    __slots__ = ("_all", "_rows", "spec")

    def __init__(self, spec: ModelSpec, *, everything: bool = True) -> None:
        self.spec = spec
        self._rows = [np.zeros(out, dtype=bool) for out, _ in spec.layer_shapes]
        self._all = everything

    @property
    def everything(self) -> bool:
        return self._all

    def mark(self, subnet: Subnet | None = None) -> None:
        """The model moved within ``subnet``'s parameters (None: anywhere)."""
        if self._all:
            return
        if subnet is None:
            self._all = True
            return
        if subnet.spec.widths != self.spec.widths:
            raise ValueError("changed rows: a subnet of another model")
        for li, rows in enumerate(self._rows):
            rows[subnet.rows(li)] = True

    def update(self, other: ChangedRows) -> None:
        """Add ``other``'s changes (a union)."""
        if self._all:
            return
        if other._all:
            self._all = True
            return
        for mine, theirs in zip(self._rows, other._rows, strict=True):
            mine |= theirs

    def take(self) -> ChangedRows:
        """The changes so far, as a new tracker; this one starts again from none."""
        out = ChangedRows(self.spec, everything=self._all)
        out._rows, self._rows = self._rows, [np.zeros_like(r) for r in self._rows]
        self._all = False
        return out

    def clear(self) -> None:
        """Nothing changed (the model equals what was last stored)."""
        self._all = False
        for r in self._rows:
            r[:] = False

    def groups(self, plan: Sequence[NeuronGroup]) -> list[int]:
        """Indices into ``plan`` of the groups holding a changed row."""
        if self._all:
            return list(range(len(plan)))
        # Per layer, a prefix count of changed rows answers "any in [r0, r1)" in O(1).
        prefix = [np.concatenate(([0], np.cumsum(r))) for r in self._rows]
        return [
            i
            for i, g in enumerate(plan)
            if prefix[g.layer][g.row_end] > prefix[g.layer][g.row_start]
        ]

    def fraction(self) -> float:
        """Share of all rows marked (1.0 when everything is)."""
        if self._all:
            return 1.0
        return sum(int(r.sum()) for r in self._rows) / sum(r.size for r in self._rows)
