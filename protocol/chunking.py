"""Chunking: split Params (or any named set of float32 arrays) into frames that fit.

Theory of operation (docs/protocol.md §5). What is sent is a *layout*: an ordered
list of blocks, each a float32 array of shape ``(rows,)`` or ``(rows, cols)``
named ``(layer, part)``. Params has per layer a ``W`` block (out × in) and a ``b``
block (out,). A chunk carries whole rows ``[row_start, row_end)`` of one block,
encoded by one codec, so a neuron row is never split; the number of rows per chunk
is the largest whose encoded frame fits ``max_message_bytes`` (and, when given,
the preferred ``target_bytes``: ``LinkLimits.frame_bytes``, one burst of the
link; a row larger than the target goes alone), computed up front from the
codec's exact ``encoded_size`` plus the worst-case msgpack envelope. A block
whose single row cannot fit ``max_message_bytes`` is a ValueError before
anything is sent. Chunks
come in layout order (layer 0 first), so a receiver can start early.

With ``spans`` (a peer that said it takes them) a chunk with room left after the
end of a block goes on into the next blocks: a :data:`Span` of pieces, each
encoded alone and concatenated, ``chunk.blocks`` saying how many blocks it
touches. A small model is then one frame instead of two per layer, which counts
on links limited in messages per second and on servers paying per frame.

The receiving half is protocol/reassembly.py; each half is tested against the other.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from compression import codecs
from nn.params import Params
from nn.spec import ModelSpec
from protocol.checksum import crc32
from protocol.errors import ProtocolError
from protocol.messages import MAX_CHUNK_BLOCKS, U32, Chunk, encode


@dataclass(frozen=True, slots=True)
class Block:
    """One named float32 array of a layout; chunks split it by rows."""

    layer: int
    part: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.shape) not in (1, 2) or min(self.shape) < 1:
            raise ValueError(f"block ({self.layer}, {self.part!r}): bad shape {self.shape}")

    @property
    def key(self) -> tuple[int, str]:
        return (self.layer, self.part)

    @property
    def rows(self) -> int:
        return self.shape[0]

    def rows_shape(self, r0: int, r1: int) -> tuple[int, ...]:
        return (r1 - r0, *self.shape[1:])


@dataclass(frozen=True, slots=True)
class Piece:
    """Rows ``[row_start, row_end)`` of one block: what one chunk will carry."""

    block: Block
    row_start: int
    row_end: int


Layout = tuple[Block, ...]


@functools.lru_cache(maxsize=64)
def params_layout(spec: ModelSpec) -> Layout:
    """Per layer ``(l, "W")`` then ``(l, "b")``: the order a forward pass needs them.
    Cached: every model transfer and every reassembler asks for it."""
    out: list[Block] = []
    for li, (o, i) in enumerate(spec.layer_shapes):
        out += [Block(li, "W", (o, i)), Block(li, "b", (o,))]
    return tuple(out)


def named_layout(arrays: Mapping[str, np.ndarray]) -> Layout:
    """A named set of arrays (optimizer state, a dict of deltas): block ``i`` is
    ``(i, name)`` in mapping order, so names must be unique (they are)."""
    return tuple(Block(i, name, tuple(np.shape(a))) for i, (name, a) in enumerate(arrays.items()))


#: The pieces one chunk carries, in layout order: one piece, or with spans the tail
#: of a block, whole blocks, and the head of a block (``chunk.blocks`` = its length).
Span = tuple[Piece, ...]


@functools.lru_cache(maxsize=256)
def _overhead_for(transfer_bytes: int, part: str, spans: bool = False) -> int:
    """Worst-case frame bytes of a chunk besides its payload (every int at max).
    Only the transfer id's length matters: msgpack sizes a str by its length."""
    probe = Chunk(
        transfer="x" * transfer_bytes,
        seq=(1 << 24) - 2,
        total=(1 << 24) - 1,
        layer=65535,
        part=part,
        row_start=U32 - 1,
        row_end=U32,
        codec=255,
        crc=U32,
        blocks=MAX_CHUNK_BLOCKS if spans else 1,
        payload=b"",
    )
    return len(encode(probe)) - 2 + 5  # empty bin8 header -> worst bin32 header


def plan_chunks(
    layout: Sequence[Block],
    *,
    max_message_bytes: int,
    codec: str | int = "fp32",
    transfer: str,
    target_bytes: int | None = None,
    spans: bool = False,
) -> list[Span]:
    """The chunks (in send order, each as the pieces it carries) whose frames all
    fit ``max_message_bytes``, and ``target_bytes`` too where one row does.

    ``spans`` lets a chunk that has room left after the end of a block go on into
    the next ones (only for a peer that said it takes them: ``hello.spans``,
    ``welcome.spans``). Raises ValueError when one row of a block cannot fit: a
    configuration error to fix before anything is sent (raise the limit or use a
    smaller codec).
    """
    target = _target(max_message_bytes, target_bytes)
    plan = _plan(tuple(layout), max_message_bytes, codec, len(transfer.encode()), target, spans)
    if len(plan) > 1 << 24:
        raise ValueError(f"transfer {transfer!r}: {len(plan)} chunks, more than 2**24")
    return list(plan)


def _target(max_message_bytes: int, target_bytes: int | None) -> int | None:
    """A target at or above the hard limit changes nothing: one cache entry for both."""
    return None if target_bytes is None or target_bytes >= max_message_bytes else target_bytes


def _rows_fitting(c: codecs.Codec, blk: Block, r0: int, budget: int) -> int:
    """The most rows of ``blk`` from ``r0`` whose encoding fits ``budget`` (may be 0)."""
    lo, hi = 0, blk.rows - r0
    if c.encoded_size(blk.rows_shape(r0, r0 + hi)) <= budget:
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if c.encoded_size(blk.rows_shape(r0, r0 + mid)) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


@functools.lru_cache(maxsize=64)
def _plan(
    layout: tuple[Block, ...],
    max_message_bytes: int,
    codec: str | int,
    transfer_bytes: int,
    target_bytes: int | None,
    spans: bool = False,
) -> tuple[Span, ...]:
    """The plan depends only on these, so every task of a job reuses one (the
    simulator plans hundreds of transfers per virtual second)."""
    c = codecs.get(codec)
    one_rows = [c.encoded_size(blk.rows_shape(0, 1)) for blk in layout]
    for blk, one_row in zip(layout, one_rows, strict=True):  # a bad block fails up front
        budget = max_message_bytes - _overhead_for(transfer_bytes, blk.part)
        if one_row > budget:
            raise ValueError(
                f"block ({blk.layer}, {blk.part!r}): one row of shape {blk.shape[1:] or (1,)} "
                f"encodes to {one_row} bytes with codec {c.name}, "
                f"more than the {budget} payload bytes a {max_message_bytes}-byte frame "
                "allows; raise max_message_bytes or use a smaller codec"
            )
    plan: list[Span] = []
    i, r0 = 0, 0
    while i < len(layout):
        blk = layout[i]
        overhead = _overhead_for(transfer_bytes, blk.part)
        budget = max_message_bytes - overhead
        if target_bytes is not None:
            budget = min(budget, max(one_rows[i], target_bytes - overhead))
        n = max(1, _rows_fitting(c, blk, r0, budget))
        span = [Piece(blk, r0, r0 + n)]
        budget -= c.encoded_size(blk.rows_shape(r0, r0 + n))
        r0 += n
        if r0 == blk.rows:
            i, r0 = i + 1, 0
            if spans:
                # going on costs the ``blocks`` key, so a chunk that stays in its block
                # is planned exactly as without spans (and spans never need more chunks)
                budget -= _overhead_for(transfer_bytes, blk.part, True) - overhead
            while spans and i < len(layout) and len(span) < MAX_CHUNK_BLOCKS:
                nxt = layout[i]
                n = _rows_fitting(c, nxt, 0, budget)
                if n == 0:
                    break
                span.append(Piece(nxt, 0, n))
                budget -= c.encoded_size(nxt.rows_shape(0, n))
                if n < nxt.rows:
                    r0 = n
                    break
                i += 1
        plan.append(tuple(span))
    return tuple(plan)


def join_pieces(parts: list[bytes]) -> bytes:
    """A span's payload: its pieces' encodings in layout order. One piece is kept as
    it is, so a zero-copy fp32 view stays a view (``b"".join`` would copy it)."""
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _payload(c: codecs.Codec, block: np.ndarray, rng: np.random.Generator | None) -> bytes:
    if c.id == codecs.CodecId.FP32 and block.dtype == np.dtype("<f4") and block.flags.c_contiguous:
        return memoryview(block).cast("B")  # type: ignore[return-value]  # zero-copy fast path
    return c.encode(np.ascontiguousarray(block), rng=rng)


def iter_chunks(
    layout: Sequence[Block],
    arrays: Sequence[np.ndarray],
    *,
    max_message_bytes: int,
    codec: str | int = "fp32",
    transfer: str,
    rng: np.random.Generator | None = None,
    copy: bool = True,
    target_bytes: int | None = None,
    spans: bool = False,
) -> Iterator[Chunk]:
    """Chunks of ``arrays`` (one per layout block). ``copy=False`` lets fp32
    payloads be views into ``arrays``: encode each chunk before the arrays change."""
    if len(arrays) != len(layout):
        raise ValueError(f"chunking: {len(arrays)} arrays for {len(layout)} blocks")
    for blk, a in zip(layout, arrays, strict=True):
        if a.shape != blk.shape or a.dtype != np.float32:
            raise ValueError(
                f"block ({blk.layer}, {blk.part!r}): expected float32 {blk.shape}, "
                f"got {a.dtype} {a.shape}"
            )
    c = codecs.get(codec)
    index = {blk.key: a for blk, a in zip(layout, arrays, strict=True)}
    plan = plan_chunks(
        layout,
        max_message_bytes=max_message_bytes,
        codec=codec,
        transfer=transfer,
        target_bytes=target_bytes,
        spans=spans,
    )
    for seq, span in enumerate(plan):
        payload = join_pieces(
            [_payload(c, index[p.block.key][p.row_start : p.row_end], rng) for p in span]
        )
        if copy and isinstance(payload, memoryview):
            payload = payload.tobytes()
        yield piece_chunk(
            span, seq=seq, total=len(plan), codec=c, transfer=transfer, payload=payload
        )


_TRANSFER_CHECK = Chunk.SCHEMA["transfer"]


def piece_chunk(
    span: Span, *, seq: int, total: int, codec: codecs.Codec, transfer: str, payload: bytes
) -> Chunk:
    """The chunk message that carries ``payload`` (the pieces of ``span``, each
    encoded by ``codec``, concatenated).

    Every field but ``transfer`` comes from a plan or is computed here, so only
    that one is checked; the rest skip the per-field checks (``Message.trusted``).
    """
    try:
        _TRANSFER_CHECK(transfer, "chunk.transfer")
    except ProtocolError as exc:
        raise ValueError(exc.message) from None
    first, last = span[0], span[-1]
    return Chunk.trusted(
        transfer=transfer,
        seq=seq,
        total=total,
        layer=first.block.layer,
        part=first.block.part,
        row_start=first.row_start,
        row_end=last.row_end,
        codec=int(codec.id),
        crc=crc32(payload),
        blocks=len(span),
        payload=payload,
    )


def params_arrays(params: Params) -> list[np.ndarray]:
    """W and b of every layer in ``params_layout`` order (views, no copies)."""
    return [a for W, b in zip(params.W, params.b, strict=True) for a in (W, b)]


@functools.lru_cache(maxsize=64)
def _params_plan(
    spec: ModelSpec,
    max_message_bytes: int,
    codec: str | int,
    transfer_bytes: int,
    target_bytes: int | None,
    spans: bool = False,
) -> tuple[tuple[Span, int, int, tuple[tuple[int, int, tuple[int, ...]], ...]], ...]:
    """``plan_chunks`` of ``params_layout(spec)`` with each chunk's range ``[a, b)``
    in the flat Params buffer (a span's pieces are adjacent there) and each piece's
    own range and rows' shape: everything chunking a model needs that does not
    depend on its values (a coordinator chunks a new version per result)."""
    offsets = spec.layer_offsets()
    out = []
    for span in _plan(
        params_layout(spec), max_message_bytes, codec, transfer_bytes, target_bytes, spans
    ):
        pieces = []
        for p in span:
            blk = p.block
            w0, b0, _ = offsets[blk.layer]
            if blk.part == "W":
                cols = blk.shape[1]
                a, b = w0 + p.row_start * cols, w0 + p.row_end * cols
            else:
                a, b = b0 + p.row_start, b0 + p.row_end
            pieces.append((a, b, blk.rows_shape(p.row_start, p.row_end)))
        out.append((span, pieces[0][0], pieces[-1][1], tuple(pieces)))
    return tuple(out)


def chunk_params(
    params: Params,
    *,
    max_message_bytes: int,
    codec: str | int = "fp32",
    transfer: str,
    rng: np.random.Generator | None = None,
    target_bytes: int | None = None,
    spans: bool = False,
) -> list[Chunk]:
    """A model or a delta as chunks, layer 0 first (payloads are copies).

    The same chunks as ``iter_chunks`` over ``params_arrays``, from a cached plan
    of flat-buffer ranges (tests/protocol/test_chunking.py holds them equal)."""
    c = codecs.get(codec)
    target = _target(max_message_bytes, target_bytes)
    plan = _params_plan(
        params.spec, max_message_bytes, codec, len(transfer.encode()), target, spans
    )
    if len(plan) > 1 << 24:
        raise ValueError(f"transfer {transfer!r}: {len(plan)} chunks, more than 2**24")
    data = params.data
    raw = c.id == codecs.CodecId.FP32 and data.dtype == np.dtype("<f4")
    total = len(plan)
    out = []
    for seq, (span, a, b, pieces) in enumerate(plan):
        if raw:
            payload = data[a:b].tobytes()
        else:
            payload = join_pieces(
                [c.encode(data[pa:pb].reshape(shape), rng=rng) for pa, pb, shape in pieces]
            )
        out.append(
            piece_chunk(span, seq=seq, total=total, codec=c, transfer=transfer, payload=payload)
        )
    return out


def encode_params(
    params: Params,
    *,
    max_message_bytes: int,
    codec: str | int = "fp32",
    transfer: str,
    rng: np.random.Generator | None = None,
    target_bytes: int | None = None,
    spans: bool = False,
) -> list[bytes]:
    """Frames of ``chunk_params``: the fast path, one copy of the data in all."""
    arrays = params_arrays(params)
    chunks = iter_chunks(
        params_layout(params.spec),
        arrays,
        max_message_bytes=max_message_bytes,
        codec=codec,
        transfer=transfer,
        rng=rng,
        copy=False,
        target_bytes=target_bytes,
        spans=spans,
    )
    return [encode(ch) for ch in chunks]


def chunk_named(
    arrays: Mapping[str, np.ndarray],
    *,
    max_message_bytes: int,
    codec: str | int = "fp32",
    transfer: str,
    rng: np.random.Generator | None = None,
    target_bytes: int | None = None,
    spans: bool = False,
) -> list[Chunk]:
    """Any named set of float32 1-D/2-D arrays as chunks (see ``named_layout``)."""
    return list(
        iter_chunks(
            named_layout(arrays),
            list(arrays.values()),
            max_message_bytes=max_message_bytes,
            codec=codec,
            transfer=transfer,
            rng=rng,
            target_bytes=target_bytes,
            spans=spans,
        )
    )
