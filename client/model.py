"""The model a client session holds, and the one on its way.

A task's model comes one of three ways: built from ``task.init_seed`` (version
0, checked against the coordinator's CRC-32, §12.3), the one held already
(``base_version``), or downloaded as chunks, whole or as a difference added to
the held copy (``delta_base``). The held model is replaced, never changed in
place: a running compute may still read the old one. A model held after a
sub-model task is a slice (§3.3.1), so it is held for a task only at its shape.
"""

from __future__ import annotations

import logging

from nn.params import Params
from nn.spec import LEGACY_INIT_SCHEME, ModelSpec
from protocol import messages as m
from protocol.checksum import crc32
from protocol.reassembly import Reassembler

log = logging.getLogger(__name__)


class HeldModel:
    """``params`` at ``version`` (None: none), and a download in progress."""

    def __init__(self) -> None:
        self.params: Params | None = None
        self.version: int | None = None
        #: seconds the last model download took, task frame to last chunk
        self.last_download_s: float | None = None
        self._download: Reassembler | None = None
        self._download_task: m.Task | None = None
        self._download_started = 0.0

    @property
    def downloading(self) -> m.Task | None:
        """The task whose model is on its way."""
        return self._download_task

    def holds(self, version: int, spec: ModelSpec) -> bool:
        """Whether the model held is ``version`` at ``spec``'s shape."""
        return (
            self.params is not None
            and self.version == version
            and self.params.spec.widths == spec.widths
        )

    def seed(self, task: m.Task) -> str | None:
        """Build version 0 from ``task.init_seed``; why not, when its CRC-32 is
        not the coordinator's (another NumPy draws another init: training on it
        would send updates against a model the coordinator does not have)."""
        assert task.init_seed is not None
        model = task.spec.init_params(task.init_seed, scheme=task.init_scheme or LEGACY_INIT_SCHEME)
        crc = crc32(model.data)
        if crc != task.init_crc:
            return (
                f"version 0 from init_seed {task.init_seed} has CRC-32 "
                f"{crc}, the coordinator's is {task.init_crc}: this "
                "client must download it (desktop client: --no-seeded-init)"
            )
        self.params, self.version = model, 0
        return None

    def download(self, task: m.Task, now: float) -> None:
        """``task``'s model comes in chunks from now."""
        assert task.model_transfer is not None
        self._download = Reassembler.for_params(
            task.spec, transfer=task.model_transfer, total=task.num_chunks
        )
        self._download_task = task
        self._download_started = now

    def stop_download(self) -> None:
        self._download = self._download_task = None

    def chunk(self, msg: m.Chunk, now: float) -> m.Task | None:
        """A model chunk: the task whose model is now held, once the last one is
        in (None: more to come, a superseded transfer's chunk, or a delta that
        made the model non-finite, which drops it). A refused chunk raises
        ``ProtocolError``."""
        dl, task = self._download, self._download_task
        if dl is None or msg.transfer != dl.transfer or task is None:
            return None
        dl.add(msg)
        if not dl.done:
            return None
        self._download = self._download_task = None
        self.last_download_s = now - self._download_started
        if task.delta_base is not None:
            assert self.params is not None and self.version == task.delta_base
            model = self.params.copy()  # a running compute may still read the old one
            model.add_(dl.params())
            if not model.is_finite():
                log.warning("model delta made the model non-finite: dropped")
                self.params = None
                self.version = None
                return None
            self.params = model
        else:
            self.params = dl.params()
        self.version = task.model_version
        return task
