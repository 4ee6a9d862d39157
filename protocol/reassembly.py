"""Reassembly: the chunks of one transfer, in any order, back into float32 arrays.

The receiving half of protocol/chunking.py (docs/protocol.md §5). A
:class:`Reassembler` rejects, with a ProtocolError and unchanged, anything that
does not fit: another transfer, a different total, a duplicate seq, rows outside
the block or overlapping rows already received, an unknown codec, a bad checksum
or a payload the codec refuses.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import numpy as np

from compression import codecs
from nn.params import Params
from nn.spec import ModelSpec
from protocol.checksum import crc32
from protocol.chunking import Block, params_layout
from protocol.errors import ErrorCode, ProtocolError
from protocol.messages import Chunk


@functools.lru_cache(maxsize=64)
def _flat_starts(spec: ModelSpec) -> tuple[tuple[int, int], ...]:
    """Per block of ``params_layout(spec)``: its start in the flat Params buffer and
    its values per row (W: the layer's inputs; b: 1)."""
    out = []
    for (_o, i), (w0, b0, _) in zip(spec.layer_shapes, spec.layer_offsets(), strict=True):
        out += [(w0, i), (b0, 1)]
    return tuple(out)


def _where(chunk: Chunk) -> str:
    """How an error names a chunk (built only when there is an error)."""
    return f"chunk {chunk.seq} of {chunk.transfer!r}"


class Reassembler:
    """Collects the chunks of one transfer, in any order, into float32 arrays.

    Call order: ``add`` each chunk (ProtocolError on anything that does not fit;
    the reassembler is unchanged then), ``missing()`` any time, and once ``done``
    ``arrays()`` / ``params()``. ``total`` is what the announcing message said
    (task.num_chunks / result.num_chunks); None takes it from the first chunk. A
    ``total`` no layout could need raises ProtocolError(BAD_FIELD) right away.
    """

    def __init__(
        self,
        layout: Sequence[Block],
        *,
        transfer: str,
        total: int | None = None,
        spec: ModelSpec | None = None,
        out: Params | None = None,
    ) -> None:
        self.layout = tuple(layout)
        self.transfer = transfer
        self.total = total
        self._params: Params | None = None
        if out is not None and (spec is None or out.spec.widths != spec.widths):
            raise ValueError("reassembler: out must be Params of the given spec")
        #: each block's start in the flat Params buffer and its values per row, when
        #: the transfer lands in one (``spec``): fp32 chunks are then copied whole
        self._flat: tuple[tuple[int, int], ...] | None = None
        if spec is not None:
            if self.layout != params_layout(spec):
                raise ValueError("reassembler: layout is not the params layout of spec")
            self._params = out if out is not None else Params.zeros(spec)
            views = [a for W, b in zip(self._params.W, self._params.b, strict=True) for a in (W, b)]
            self._flat = _flat_starts(spec)
        else:
            views = [np.zeros(b.shape, dtype=np.float32) for b in self.layout]
        # one byte per row (1 = received): find/assign on slices copy nothing
        self._have = {b.key: bytearray(b.rows) for b in self.layout}
        self._blocks = {
            b.key: (b, v, self._have[b.key]) for b, v in zip(self.layout, views, strict=True)
        }
        self._index = {b.key: i for i, b in enumerate(self.layout)}
        self._seqs: set[int] = set()
        self._rows_total = self._rows_left = sum(b.rows for b in self.layout)
        if total is not None and not 1 <= total <= self._rows_total:
            # ``total`` comes from the peer's task/result: its fault, not ours.
            raise ProtocolError(
                ErrorCode.BAD_FIELD,
                f"num_chunks: {total} outside 1..{self._rows_total} (rows of the layout)",
            )

    @classmethod
    def for_params(
        cls,
        spec: ModelSpec,
        *,
        transfer: str,
        total: int | None = None,
        out: Params | None = None,
    ) -> Reassembler:
        """``out`` reuses a caller's buffer (a client keeps one model): rows not yet
        received keep their old values, so check ``done`` before using it."""
        return cls(params_layout(spec), transfer=transfer, total=total, spec=spec, out=out)

    @classmethod
    def for_named(
        cls, shapes: Mapping[str, tuple[int, ...]], *, transfer: str, total: int | None = None
    ) -> Reassembler:
        layout = tuple(Block(i, n, tuple(s)) for i, (n, s) in enumerate(shapes.items()))
        return cls(layout, transfer=transfer, total=total)

    def add(self, chunk: Chunk) -> None:
        """Validate and place one chunk; see the class docstring for what is refused."""
        if chunk.transfer != self.transfer:
            raise ProtocolError(
                ErrorCode.UNKNOWN_TASK, f"{_where(chunk)}: expected transfer {self.transfer!r}"
            )
        if self.total is None:
            if chunk.total > self._rows_total:  # every chunk carries at least one row
                raise ProtocolError(
                    ErrorCode.BAD_CHUNK,
                    f"{_where(chunk)}: total {chunk.total} exceeds the {self._rows_total} rows",
                )
            self.total = chunk.total
        elif chunk.total != self.total:
            raise ProtocolError(
                ErrorCode.BAD_CHUNK, f"{_where(chunk)}: total {chunk.total}, expected {self.total}"
            )
        if chunk.seq in self._seqs:
            raise ProtocolError(ErrorCode.DUPLICATE, f"{_where(chunk)}: seq received twice")
        first = self._index.get((chunk.layer, chunk.part))
        if first is None:
            raise ProtocolError(
                ErrorCode.BAD_CHUNK,
                f"{_where(chunk)}: no block (layer {chunk.layer}, {chunk.part!r})",
            )
        k = chunk.blocks
        if first + k > len(self.layout):
            raise ProtocolError(
                ErrorCode.BAD_CHUNK,
                f"{_where(chunk)}: spans {k} blocks from ({chunk.layer}, {chunk.part!r}), "
                f"the layout has {len(self.layout) - first} from there",
            )
        pieces = []
        for j in range(k):
            blk = self.layout[first + j]
            r0 = chunk.row_start if j == 0 else 0
            r1 = chunk.row_end if j == k - 1 else blk.rows
            if r1 > blk.rows or r0 >= r1:
                raise ProtocolError(
                    ErrorCode.BAD_CHUNK,
                    f"{_where(chunk)}: rows [{r0}, {r1}) out of range for block "
                    f"({blk.layer}, {blk.part!r}) with {blk.rows} rows",
                )
            if self._blocks[blk.key][2].find(1, r0, r1) >= 0:
                raise ProtocolError(
                    ErrorCode.CONFLICT,
                    f"{_where(chunk)}: rows [{r0}, {r1}) of block ({blk.layer}, {blk.part!r}) "
                    "overlap rows already received",
                )
            pieces.append((blk, r0, r1))
        try:
            codec = codecs.get(chunk.codec)
        except codecs.CodecError as exc:
            raise ProtocolError(ErrorCode.BAD_CHUNK, f"{_where(chunk)}: {exc}") from None
        if crc32(chunk.payload) != chunk.crc:
            raise ProtocolError(ErrorCode.CHECKSUM, f"{_where(chunk)}: crc32 mismatch")
        payload = chunk.payload
        flat = self._flat
        if flat is not None and codec.id == codecs.CodecId.FP32:
            # The pieces are adjacent in the flat buffer (layout order): one copy of
            # the whole payload, when it is exactly their size; anything else takes
            # the path below, which refuses it as before.
            (start, per_row), (end_start, end_per_row) = flat[first], flat[first + k - 1]
            a = start + pieces[0][1] * per_row
            b = end_start + pieces[-1][2] * end_per_row
            if len(payload) == 4 * (b - a):
                assert self._params is not None
                self._params.data[a:b] = np.frombuffer(payload, dtype="<f4", count=b - a)
                self._received(pieces, chunk.seq)
                return
        if k > 1:  # split at each piece's size (the codec may read it from its header)
            view, at, slices = memoryview(payload), 0, []
            try:
                for blk, r0, r1 in pieces:
                    size = codec.payload_size(view[at:], blk.rows_shape(r0, r1))
                    slices.append(view[at : at + size])
                    at += size
            except codecs.CodecError as exc:
                raise ProtocolError(ErrorCode.BAD_CHUNK, f"{_where(chunk)}: {exc}") from None
            if at != len(payload):
                raise ProtocolError(
                    ErrorCode.BAD_CHUNK,
                    f"{_where(chunk)}: payload of {len(payload)} bytes, its {k} pieces "
                    f"encode to {at} with codec {codec.name}",
                )
        else:
            slices = [payload]
        try:
            values = [
                codec.decode(data, blk.rows_shape(r0, r1))
                for data, (blk, r0, r1) in zip(slices, pieces, strict=True)
            ]
        except codecs.CodecError as exc:
            raise ProtocolError(ErrorCode.BAD_CHUNK, f"{_where(chunk)}: {exc}") from None
        for v, (blk, r0, r1) in zip(values, pieces, strict=True):
            self._blocks[blk.key][1][r0:r1] = v
        self._received(pieces, chunk.seq)

    def _received(self, pieces: list[tuple[Block, int, int]], seq: int) -> None:
        """Mark the pieces' rows and the chunk's seq received (values are in)."""
        for blk, r0, r1 in pieces:
            self._blocks[blk.key][2][r0:r1] = b"\x01" * (r1 - r0)
            self._rows_left -= r1 - r0
        self._seqs.add(seq)

    @property
    def received(self) -> int:
        return len(self._seqs)

    @property
    def done(self) -> bool:
        """Every row of every block arrived and so did ``total`` chunks."""
        return self._rows_left == 0 and self.total is not None and len(self._seqs) == self.total

    def missing(self) -> list[tuple[int, str, int, int]]:
        """Row ranges not yet received, as ``(layer, part, row_start, row_end)``."""
        out = []
        for blk in self.layout:
            have = np.frombuffer(self._have[blk.key], dtype=bool)
            if have.all():
                continue
            edges = np.flatnonzero(np.diff(np.concatenate(([True], have, [True])).astype(np.int8)))
            for s, e in zip(edges[::2], edges[1::2], strict=True):
                out.append((blk.layer, blk.part, int(s), int(e)))
        return out

    def missing_seqs(self) -> list[int]:
        """Sequence numbers not yet received (empty until ``total`` is known)."""
        if self.total is None:
            return []
        return [s for s in range(self.total) if s not in self._seqs]

    def _check_done(self) -> None:
        if not self.done:
            raise ValueError(
                f"reassembler {self.transfer!r}: not done; missing {self.missing()[:5]} "
                f"seqs {self.missing_seqs()[:5]}"
            )

    def arrays(self) -> dict[tuple[int, str], np.ndarray]:
        """The reassembled blocks by ``(layer, part)``; call once ``done``."""
        self._check_done()
        return {k: v for k, (_, v, _) in self._blocks.items()}

    def params(self) -> Params:
        """The reassembled Params (only for a reassembler made ``for_params``)."""
        self._check_done()
        if self._params is None:
            raise ValueError("reassembler: not a params transfer; use arrays()")
        return self._params
