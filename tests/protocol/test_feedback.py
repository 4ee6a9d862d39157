"""feedback_chunks: chunks a server can reassemble, residuals keyed by rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compression import ErrorFeedback, get
from nn.params import Params
from nn.spec import ModelSpec
from protocol.chunking import chunk_params
from protocol.feedback import feedback_chunks
from protocol.reassembly import Reassembler

SPEC = ModelSpec(widths=(12, 9, 4))


def reassemble(chunks) -> np.ndarray:
    r = Reassembler.for_params(SPEC, transfer=chunks[0].transfer, total=len(chunks))
    for c in chunks:
        r.add(c)
    return r.params().data.copy()


@settings(max_examples=30, deadline=None)
@given(
    codec=st.sampled_from(["fp32", "fp16", "int8", "int4", "topk:0.1", "topk:0.2+int8"]),
    limit=st.sampled_from([1024, 1200, 1 << 20]),
    seed=st.integers(0, 2**32 - 1),
    rounds=st.integers(1, 4),
    spans=st.booleans(),
)
def test_sent_plus_owed_is_everything(
    codec: str, limit: int, seed: int, rounds: int, spans: bool
) -> None:
    rng = np.random.default_rng(seed)
    ef = ErrorFeedback(get(codec))
    total = np.zeros(SPEC.num_params, np.float32)
    sent = np.zeros(SPEC.num_params, np.float32)
    for i in range(rounds):
        delta = Params.from_flat(SPEC, rng.normal(0, 1, SPEC.num_params).astype(np.float32))
        chunks = feedback_chunks(
            delta, ef, max_message_bytes=limit, transfer=f"t{i}", rng=rng, spans=spans
        )
        assert all(c.codec == int(get(codec).id) for c in chunks)
        assert all(len(c.payload) <= limit for c in chunks)
        sent += reassemble(chunks)
        total += delta.data
    owed = Params.zeros(SPEC)
    for layer, part, r0, r1 in ef.blocks():
        (owed.W[layer] if part == "W" else owed.b[layer])[r0:r1] = ef.residual(
            (layer, part, r0, r1)
        )
    np.testing.assert_allclose(sent + owed.data, total, atol=1e-4)
    if get(codec).lossless:
        assert len(ef) == 0


@pytest.mark.parametrize("spans", [False, True])
def test_first_round_matches_plain_chunking(spans: bool) -> None:
    """With nothing owed yet, feedback changes nothing on the wire."""
    delta = Params.from_flat(SPEC, np.linspace(-1, 1, SPEC.num_params, dtype=np.float32))
    ef = ErrorFeedback(get("topk:0.1+int8"))
    a = feedback_chunks(delta, ef, max_message_bytes=1024, transfer="t", spans=spans)
    b = chunk_params(
        delta, max_message_bytes=1024, codec="topk:0.1+int8", transfer="t", spans=spans
    )
    assert a == b and (len(a) == 1) is spans


def test_shape_change_is_refused() -> None:
    ef = ErrorFeedback(get("topk:0.1"))
    feedback_chunks(Params.zeros(SPEC), ef, max_message_bytes=1 << 20, transfer="t")
    with pytest.raises(ValueError, match="changed shape"):
        ef.encode((0, "W", 0, 9), np.zeros((9, 3), np.float32))
