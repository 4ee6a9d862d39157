"""Results arriving in pieces: a ``result`` header, then its update's chunks.

A client uploads a result as a ``result`` message naming ``num_chunks``, then
that many ``chunk`` messages whose ``transfer`` is the task id
(docs/protocol.md §3.4, §3.5, §5). The core keeps one :class:`Uploads` per connection;
it hands each finished :class:`Upload` to the result path (coordinator/core/results.py)
with the bytes it took on the wire, which the metrics report. A header or chunk
that breaks the rules is the peer's fault: a ``ProtocolError`` the core turns into
an error frame and a Close.

Only a result the server may take is checked against its task's layout: one for
a task the sender does not hold (an id from before a restart, another client's
task) is counted in, its payloads dropped, and answered ``ack`` ``accepted =
false`` once its chunks are in (§3.6). The server may no longer know that task's
layout (a sub-model task's subnet), and the sender's fault is only that the
result came too late, not a protocol error; nor is a model-sized buffer taken
for a result that will be thrown away.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compression import get as get_codec
from nn.spec import ModelSpec
from protocol import messages as m
from protocol.chunking import Layout, params_layout
from protocol.errors import ErrorCode, ProtocolError
from protocol.reassembly import Reassembler


class Dropped:
    """The chunks of a result that will not be taken: framing checked, payloads not
    kept (its layout is not known). ``add`` refuses what ``Reassembler.add`` would
    refuse before it looks at the layout."""

    __slots__ = ("_seqs", "total", "transfer")

    def __init__(self, transfer: str, total: int) -> None:
        self.transfer = transfer
        self.total = total
        self._seqs: set[int] = set()

    def add(self, chunk: m.Chunk) -> None:
        where = f"chunk {chunk.seq} of {chunk.transfer!r}"
        if chunk.total != self.total:
            raise ProtocolError(
                ErrorCode.BAD_CHUNK, f"{where}: total {chunk.total}, expected {self.total}"
            )
        if not 0 <= chunk.seq < self.total:
            raise ProtocolError(ErrorCode.BAD_CHUNK, f"{where}: seq outside 0..{self.total - 1}")
        if chunk.seq in self._seqs:
            raise ProtocolError(ErrorCode.DUPLICATE, f"{where}: seq received twice")
        self._seqs.add(chunk.seq)

    @property
    def done(self) -> bool:
        return len(self._seqs) == self.total


#: results one connection may have uploading at once (headers whose chunks are not
#: all in); clients send each result's chunks right after its header, so one
MAX_OPEN = 4


@dataclass(slots=True)
class Upload:
    """A result whose chunks are arriving, and the bytes they took so far.
    ``reasm`` is a ``Dropped`` for a result that will not be taken."""

    result: m.Result
    reasm: Reassembler | Dropped
    #: the update codec its task named, and its wire id: every chunk's
    codec: str = "fp32"
    codec_id: int = 0
    frame_bytes: int = 0
    payload_bytes: int = 0
    #: the chunks as they came, kept when a journal may log the result in its wire
    #: form (a quarter of float32's bytes in int8; coordinator/runtime/journal.py)
    wire: list[m.Chunk] | None = None

    #: blocks after the update's in the layout (a lower block's boundary: 1)
    extra: int = 0

    @property
    def update(self) -> np.ndarray:
        """The uploaded update, flat (only for a result that may be taken)."""
        reasm = self.reasm
        assert isinstance(reasm, Reassembler), "a dropped upload keeps no update"
        if not self.extra:
            return reasm.params().data
        arrays = reasm.arrays()
        return np.concatenate([arrays[b.key].ravel() for b in reasm.layout[: -self.extra]])

    @property
    def boundary(self) -> np.ndarray | None:
        """A layer-split lower block's boundary activations ``[rows, width]``."""
        if not self.extra:
            return None
        assert isinstance(self.reasm, Reassembler)
        return self.reasm.arrays()[self.reasm.layout[-1].key]


def _frame_bytes(msg: m.Message, nbytes: int | None) -> int:
    """The frame's size as the driver measured it, else as this side encodes it."""
    return nbytes if nbytes is not None else len(m.encode(msg))


class Uploads:
    """The uploads in flight on one connection, by transfer (the task id)."""

    __slots__ = ("_codec", "_codec_name", "_open", "_rows", "_spec")

    def __init__(self, spec: ModelSpec, codec: str, *, extra_rows: int = 0) -> None:
        self._spec = spec
        #: the most chunks any result may announce (one row each, the whole model,
        #: and ``extra_rows`` more: a layer-split lower block's boundary rows)
        self._rows = sum(b.rows for b in params_layout(spec)) + extra_rows
        self._codec_name = codec
        #: the connection's update codec: a result's chunks are in it unless its
        #: task named another (``start``'s ``codec``)
        self._codec = int(get_codec(codec).id)
        self._open: dict[str, Upload] = {}

    def start(
        self,
        msg: m.Result,
        nbytes: int | None,
        *,
        spec: ModelSpec | None = None,
        layout: Layout | None = None,
        extra: int = 0,
        taken: bool = True,
        keep_wire: bool = False,
        codec: str | None = None,
    ) -> None:
        """A result header: chunks for ``msg.task_id`` follow, in the layout of
        ``spec`` (a sub-model task's subnet) or else of the job's model; or in
        ``layout`` (a layer-split block's), whose last ``extra`` blocks follow the
        update's; every chunk in ``codec`` (the task's ``upload_codec``; None: the
        connection's).
        ``taken=False``: the sender does not hold the task; see the module docstring.
        ``keep_wire``: keep the chunks too (``Upload.wire``)."""
        if msg.num_chunks < 1:
            raise ProtocolError(ErrorCode.BAD_FIELD, "result.num_chunks: an update is required")
        if msg.task_id in self._open:
            raise ProtocolError(ErrorCode.DUPLICATE, f"result {msg.task_id!r}: already uploading")
        if len(self._open) >= MAX_OPEN:
            raise ProtocolError(
                ErrorCode.UNEXPECTED,
                f"result {msg.task_id!r}: {len(self._open)} results already uploading "
                f"(at most {MAX_OPEN} at once; send each result's chunks after its header)",
            )
        reasm: Reassembler | Dropped
        if taken and layout is not None:
            reasm = Reassembler(layout, transfer=msg.task_id, total=msg.num_chunks)
        elif taken:
            reasm = Reassembler.for_params(
                spec or self._spec, transfer=msg.task_id, total=msg.num_chunks
            )
        elif msg.num_chunks > self._rows:
            raise ProtocolError(
                ErrorCode.BAD_FIELD,
                f"num_chunks: {msg.num_chunks} outside 1..{self._rows} (rows of the model)",
            )
        else:
            reasm = Dropped(msg.task_id, msg.num_chunks)
        name, wire_id = self._codec_name, self._codec  # what the connection's tasks name
        if codec is not None and codec != name:  # a task leased on another connection's link
            name, wire_id = codec, int(get_codec(codec).id)
        upload = self._open[msg.task_id] = Upload(
            msg, reasm, codec=name, codec_id=wire_id, extra=extra if taken else 0
        )
        if keep_wire and taken:
            upload.wire = []
        upload.frame_bytes += _frame_bytes(msg, nbytes)

    def chunk(self, msg: m.Chunk, nbytes: int | None) -> Upload | None:
        """Add a chunk; returns its upload once the last chunk is in (it leaves)."""
        upload = self._open.get(msg.transfer)
        if upload is None:
            raise ProtocolError(
                ErrorCode.UNKNOWN_TASK, f"chunk.transfer {msg.transfer!r}: no result sent"
            )
        if msg.codec != upload.codec_id:
            raise ProtocolError(
                ErrorCode.BAD_CHUNK,
                f"chunk {msg.seq} of {msg.transfer!r}: codec id {msg.codec}, the task "
                f"asked for {upload.codec!r} (id {upload.codec_id})",
            )
        upload.reasm.add(msg)
        if upload.wire is not None:
            upload.wire.append(msg)
        upload.frame_bytes += _frame_bytes(msg, nbytes)
        upload.payload_bytes += len(msg.payload)
        if not upload.reasm.done:
            return None
        del self._open[msg.transfer]
        return upload

    def in_flight(self) -> list[str]:
        """Task ids of the results whose header came and whose chunks are not all in."""
        return list(self._open)

    def __len__(self) -> int:
        return len(self._open)
