"""What a checkpoint snapshot copies of the model: the neuron groups that changed.

The service snapshots the core's state on the core thread and a writer thread stores it. A
snapshot copies just the groups holding rows changed since the one before it (nn/changes.py
tracks them), and the store writes them as an incremental checkpoint (storage ``ParamsPatch``)
on that snapshot (``base``). The writer commits snapshots one at a time, in the order they
were taken, so by the time a patch is written its base is committed. A write that fails breaks
that chain (the patches queued behind it find their base missing and fail too, holding their
acks): on the report the next snapshot is whole again.

A model in a mapped file (nn/mapped.py) is never copied whole: a whole snapshot of it (the
first one, or one after a step that moved everything), or a patch of more than
``COPY_MAX_BYTES``, is written from the file itself (``take`` says so); smaller patches are
copied and written by the writer thread. With a journal (coordinator/runtime/journal.py) such
a snapshot is written on the writer thread while merges go on, each group copied under the
model's lock and tagged with its version (storage ``LiveParams``: a fuzzy checkpoint the
journal completes on restart); without one, on the core thread, which waits for it. Why:
docs/operations.md ("Storage: checkpoints", "A model too big to hold twice").
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from nn.changes import ChangedRows
from nn.mapped import create_mapped, open_mapped
from nn.params import NeuronGroup, Params
from nn.spec import ModelSpec
from storage.layout import ParamsPatch, group_values

log = logging.getLogger(__name__)

#: a mapped model's patch above this many bytes is written from the file, not copied
COPY_MAX_BYTES = 64 << 20


class Snapshots:
    """The incremental bookkeeping of one run's checkpoints (core thread only)."""

    def __init__(self, spec: ModelSpec, plan: list[NeuronGroup]) -> None:
        self.spec = spec
        self.plan = plan
        #: the snapshot the next one is written on (None: the next one is whole)
        self.base: int | None = None

    def restored(self, version: int, changed: ChangedRows) -> None:
        """The model equals stored checkpoint ``version``: patches may start there."""
        changed.clear()
        self.base = version

    def take(
        self, version: int, params: Params, changed: ChangedRows, *, mapped: bool = False
    ) -> tuple[ParamsPatch | None, bool]:
        """The patch for a snapshot at ``version`` (None: it must be whole), and
        whether it must be written now, on this thread (a ``mapped`` model's whole
        snapshot or big patch: views of the file, not copies)."""
        rows = changed.take()
        base, self.base = self.base, version
        if base is None or rows.everything:
            return None, mapped
        # (version == base: nothing moved; the store answers CheckpointExists)
        groups = rows.groups(self.plan)
        size = sum(4 * group_values(self.spec, self.plan[i]) for i in groups)
        inline = mapped and size > COPY_MAX_BYTES
        return ParamsPatch.of(params, self.plan, groups, base, copy=not inline), inline

    def written(self, version: int, outcome: str) -> None:
        """The writer's report on the snapshot at ``version``."""
        if outcome in ("failed", "no-base"):
            log.warning("checkpoint v%d not written: the next one is whole", version)
            self.base = None


class MappedModel:
    """A job's parameters in a memory-mapped file: beside the store
    (``<store>.params``, rewritten from the checkpoint on a restart), or in a
    temporary directory without one."""

    def __init__(self, spec: ModelSpec, store_path: Path | None) -> None:
        self.spec = spec
        self._tmp = None
        if store_path is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="crowdgrad-model-")
            self.path = Path(self._tmp.name) / "model.f32"
        else:
            self.path = Path(f"{store_path}.params")

    def fresh(self, seed: int) -> Params:
        """Version 0 of the job (its init seed), written into the file."""
        log.info("%.1f GB of parameters mapped from %s", self.spec.nbytes / 1e9, self.path)
        return create_mapped(self.path, self.spec, seed)

    def blank(self) -> Params:
        """The file, sized for the model, to restore a checkpoint into."""
        with open(self.path, "ab") as f:
            f.truncate(self.spec.nbytes)
        return open_mapped(self.path, self.spec)

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
