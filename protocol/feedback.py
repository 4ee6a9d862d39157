"""Chunking a model delta through error feedback: the upload side of a lossy codec.

``protocol.chunking.chunk_params`` encodes each chunk's rows with a stateless
codec; here each chunk's rows go through an :class:`ErrorFeedback` instead, keyed
by the chunk's block and row range, so the residual of rows ``[r0, r1)`` of
``(layer, part)`` is folded into the same rows of the next update. The chunk plan
depends only on the spec, codec and frame limit, all fixed for a session, so the
keys repeat from one update to the next; if the limit changes, rows keyed by the
old ranges are simply new keys (their old residuals wait, unused, until reset).

It lives on the protocol side because it builds chunk messages: ``protocol``
depends on ``compression`` (codecs, error feedback), never the other way.
"""

from __future__ import annotations

import numpy as np

from compression.feedback import ErrorFeedback
from nn.params import Params
from protocol.chunking import (
    join_pieces,
    params_arrays,
    params_layout,
    piece_chunk,
    plan_chunks,
)
from protocol.messages import Chunk


def feedback_chunks(
    delta: Params,
    feedback: ErrorFeedback,
    *,
    max_message_bytes: int,
    transfer: str,
    rng: np.random.Generator | None = None,
    target_bytes: int | None = None,
    spans: bool = False,
) -> list[Chunk]:
    """``delta`` as chunks in ``feedback.codec``, each carrying its rows' residual."""
    codec = feedback.codec
    layout = params_layout(delta.spec)
    arrays = {blk.key: a for blk, a in zip(layout, params_arrays(delta), strict=True)}
    plan = plan_chunks(
        layout,
        max_message_bytes=max_message_bytes,
        codec=codec.name,
        transfer=transfer,
        target_bytes=target_bytes,
        spans=spans,
    )
    out: list[Chunk] = []
    for seq, span in enumerate(plan):
        parts = []
        for p in span:
            rows = np.ascontiguousarray(arrays[p.block.key][p.row_start : p.row_end])
            key = (p.block.layer, p.block.part, p.row_start, p.row_end)
            parts.append(feedback.encode(key, rows, rng=rng))
        payload = join_pieces(parts)
        out.append(
            piece_chunk(
                span, seq=seq, total=len(plan), codec=codec, transfer=transfer, payload=payload
            )
        )
    return out
