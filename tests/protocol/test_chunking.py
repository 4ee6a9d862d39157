import random

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compression import codecs
from nn.params import Params
from nn.spec import ModelSpec
from protocol.checksum import crc32
from protocol.chunking import (
    Block,
    chunk_named,
    chunk_params,
    encode_params,
    iter_chunks,
    params_layout,
    plan_chunks,
)
from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import profile
from protocol.messages import Chunk, decode, encode
from protocol.reassembly import Reassembler


def _params(preset="small", seed=0):
    return ModelSpec.preset(preset).init_params(seed)


def test_params_round_trip_in_any_order():
    p = _params()
    chunks = chunk_params(p, max_message_bytes=1024, transfer="m")
    assert len(chunks) > 8
    random.Random(3).shuffle(chunks)
    r = Reassembler.for_params(p.spec, transfer="m", total=len(chunks))
    for i, c in enumerate(chunks):
        assert not r.done
        r.add(decode(encode(c)))
        assert r.received == i + 1
    assert r.done and r.missing() == [] and r.missing_seqs() == []
    assert r.params().array_equal(p)


def test_layer_order_whole_rows_and_frame_limit():
    p = _params("medium")
    limit = 4096
    chunks = chunk_params(p, max_message_bytes=limit, transfer="m")
    keys = [(c.layer, c.part != "W") for c in chunks]
    assert keys == sorted(keys)  # layer 0 first, W before b within a layer
    for c in chunks:
        cols = p.spec.layer_shapes[c.layer][1] if c.part == "W" else 1
        assert len(c.payload) == 4 * cols * (c.row_end - c.row_start)
        assert len(encode(c)) <= limit
    assert [c.seq for c in chunks] == list(range(len(chunks)))


def test_chunks_are_as_large_as_the_limit_allows():
    p = _params("medium")
    limit = 8192
    chunks = chunk_params(p, max_message_bytes=limit, transfer="m")
    for c in chunks:
        cols = p.spec.layer_shapes[c.layer][1] if c.part == "W" else 1
        rows = p.spec.layer_shapes[c.layer][0]
        if c.row_end < rows:  # not the block's last chunk: one more row must not fit
            assert len(encode(c)) + 4 * cols > limit - 10


def test_a_row_that_cannot_fit_is_a_config_error_up_front():
    spec = ModelSpec(widths=(2000, 4))
    with pytest.raises(ValueError, match=r"block \(0, 'W'\): one row"):
        plan_chunks(params_layout(spec), max_message_bytes=4096, transfer="m")


def test_encode_params_frames_equal_chunk_frames_and_are_deterministic():
    p = _params()
    frames = encode_params(p, max_message_bytes=2048, transfer="m")
    assert frames == [encode(c) for c in chunk_params(p, max_message_bytes=2048, transfer="m")]
    assert frames == encode_params(p.copy(), max_message_bytes=2048, transfer="m")


def test_chunk_params_payloads_are_snapshots():
    p = _params()
    chunks = chunk_params(p, max_message_bytes=2048, transfer="m")
    p.data[:] = 0
    r = Reassembler.for_params(p.spec, transfer="m")
    for c in chunks:
        r.add(c)
    assert r.params().norm() > 0


def test_named_arrays_round_trip():
    rng = np.random.default_rng(0)
    arrays = {
        "m": rng.standard_normal((30, 7)).astype(np.float32),
        "v": rng.standard_normal(30).astype(np.float32),
        "step": np.ones(1, dtype=np.float32),
    }
    chunks = chunk_named(arrays, max_message_bytes=1024, transfer="opt")
    random.Random(1).shuffle(chunks)
    r = Reassembler.for_named({k: a.shape for k, a in arrays.items()}, transfer="opt")
    for c in chunks:
        r.add(c)
    got = r.arrays()
    for i, (k, a) in enumerate(arrays.items()):
        assert np.array_equal(got[(i, k)], a)
    with pytest.raises(ValueError, match="not a params transfer"):
        r.params()


def test_caller_errors():
    with pytest.raises(ValueError, match="expected float32"):
        list(
            iter_chunks(
                [Block(0, "x", (3,))],
                [np.zeros(3)],
                max_message_bytes=1024,
                transfer="t",
            )
        )
    r = Reassembler.for_params(ModelSpec.preset("tiny"), transfer="t")
    with pytest.raises(ValueError, match="not done"):
        r.params()


def _fresh():
    p = _params("tiny")
    chunks = chunk_params(p, max_message_bytes=1024, transfer="m")
    return p, chunks, Reassembler.for_params(p.spec, transfer="m", total=len(chunks))


def _mutate(c, **kw):
    wire = c.to_wire()
    wire.update(kw)
    wire.pop("type")
    return Chunk(**wire)


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"transfer": "other"}, ErrorCode.UNKNOWN_TASK),
        ({"total": 99}, ErrorCode.BAD_CHUNK),
        ({"part": "x"}, ErrorCode.BAD_CHUNK),
        ({"layer": 9}, ErrorCode.BAD_CHUNK),
        ({"row_start": 4, "row_end": 9}, ErrorCode.BAD_CHUNK),  # out of range
        ({"crc": 0}, ErrorCode.CHECKSUM),
        ({"codec": 250}, ErrorCode.BAD_CHUNK),  # unknown codec id
        ({"payload": b"\x00" * 4, "crc": crc32(b"\x00" * 4)}, ErrorCode.BAD_CHUNK),  # length
    ],
)
def test_reassembler_rejects_bad_chunks_and_stays_usable(change, code):
    p, chunks, r = _fresh()
    with pytest.raises(ProtocolError) as info:
        r.add(_mutate(chunks[0], **change))
    assert info.value.code == code
    for c in chunks:
        r.add(c)
    assert r.params().array_equal(p)


def test_duplicates_and_conflicts():
    _, chunks, r = _fresh()
    r.add(chunks[0])
    with pytest.raises(ProtocolError) as info:
        r.add(chunks[0])
    assert info.value.code == ErrorCode.DUPLICATE
    with pytest.raises(ProtocolError) as info:
        r.add(_mutate(chunks[0], seq=len(chunks) - 1))
    assert info.value.code == ErrorCode.CONFLICT


def test_a_total_larger_than_the_rows_is_refused():
    p, chunks, _ = _fresh()
    r = Reassembler.for_params(p.spec, transfer="m")
    with pytest.raises(ProtocolError, match="exceeds"):
        r.add(_mutate(chunks[0], total=1 << 24))
    with pytest.raises(ProtocolError) as info:
        Reassembler.for_params(p.spec, transfer="m", total=1 << 24)
    assert info.value.code == ErrorCode.BAD_FIELD


def test_missing_reports_row_ranges_and_seqs():
    p = _params("tiny")
    chunks = chunk_params(p, max_message_bytes=1024, transfer="m")
    r = Reassembler.for_params(p.spec, transfer="m")
    assert r.missing_seqs() == []  # total unknown until the first chunk
    assert r.missing()[0] == (0, "W", 0, 5)
    r.add(chunks[0])
    assert r.missing()[0] == (0, "b", 0, 5)
    assert r.missing_seqs() == list(range(1, len(chunks)))


block_st = st.tuples(st.integers(1, 40), st.one_of(st.none(), st.integers(1, 300))).map(
    lambda t: (t[0],) if t[1] is None else t
)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(block_st, min_size=1, max_size=4),
    st.integers(1024, 6000),
    st.integers(0, 2**32 - 1),
    st.booleans(),
)
def test_chunk_shuffle_reassemble_is_exact_within_the_limit(shapes, limit, seed, spans):
    rng = np.random.default_rng(seed)
    arrays = {f"a{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    row_bytes = max(4 * (s[1] if len(s) > 1 else 1) for s in shapes)
    try:
        chunks = chunk_named(arrays, max_message_bytes=limit, transfer="t", spans=spans)
    except ValueError:
        assert row_bytes > limit - 150  # only when one row cannot fit
        return
    if not spans:
        assert all(c.blocks == 1 for c in chunks)
    frames = [encode(c) for c in chunks]
    assert all(len(f) <= limit for f in frames)
    random.Random(seed).shuffle(frames)
    r = Reassembler.for_named({k: a.shape for k, a in arrays.items()}, transfer="t")
    for f in frames:
        r.add(decode(f, max_bytes=limit))
    assert r.done
    got = r.arrays()
    for i, (k, a) in enumerate(arrays.items()):
        assert got[(i, k)].tobytes() == a.tobytes()


@pytest.mark.parametrize("name", [n for n in codecs.names() if n != "fp32"])
def test_every_registered_codec_chunks_within_the_limit(name):
    p = _params("small", seed=1)
    chunks = chunk_params(p, max_message_bytes=1024, codec=name, transfer="m", rng=None)
    assert all(len(encode(c)) <= 1024 for c in chunks)
    r = Reassembler.for_params(p.spec, transfer="m")
    for c in chunks:
        r.add(decode(encode(c)))
    got = r.params()
    c = codecs.get(name)
    for ch in chunks:  # each piece is what the codec alone makes of those rows
        src = (p.W if ch.part == "W" else p.b)[ch.layer][ch.row_start : ch.row_end]
        want = c.decode(c.encode(np.ascontiguousarray(src)), src.shape)
        dst = (got.W if ch.part == "W" else got.b)[ch.layer][ch.row_start : ch.row_end]
        assert np.array_equal(dst, want)


def test_full_model_fits_one_roblox_frame_per_block():
    spec = ModelSpec.preset("large")
    pieces = plan_chunks(params_layout(spec), max_message_bytes=16 << 20, transfer="m")
    assert len(pieces) == 2 * spec.num_layers
    assert Params.zeros(spec).nbytes < 16 << 20


def test_reassembler_can_fill_a_reused_buffer():
    p = _params()
    out = Params.zeros(p.spec)
    chunks = chunk_params(p, max_message_bytes=2048, transfer="m")
    r = Reassembler.for_params(p.spec, transfer="m", out=out)
    for c in chunks:
        r.add(c)
    assert r.params() is out and out.array_equal(p)
    with pytest.raises(ValueError, match="out must be Params"):
        Reassembler.for_params(ModelSpec.preset("tiny"), transfer="m", out=out)


@settings(max_examples=25, deadline=None)
@given(
    widths=st.lists(st.integers(1, 40), min_size=2, max_size=4),
    limit=st.integers(1024, 6000),
    codec=st.sampled_from(["fp32", "fp16", "int8", "topk:0.25+int8"]),
    seed=st.integers(0, 2**16),
    target=st.one_of(st.none(), st.integers(1024, 6000)),
    spans=st.booleans(),
)
def test_chunk_params_equals_iter_chunks_over_the_layout(widths, limit, codec, seed, target, spans):
    """chunk_params takes a cached plan of flat-buffer spans; it must give the
    same chunks (and draw the codec's rng the same way) as the general path."""
    spec = ModelSpec(widths=tuple(widths), loss="mse")
    p = spec.init_params(seed)
    p.data[:] += np.random.default_rng(seed).standard_normal(p.data.size).astype(np.float32)
    try:
        fast = chunk_params(
            p, max_message_bytes=limit, codec=codec, transfer="t-1",
            rng=np.random.default_rng(seed), target_bytes=target, spans=spans,
        )  # fmt: skip
    except ValueError:
        with pytest.raises(ValueError):
            plan_chunks(params_layout(spec), max_message_bytes=limit, codec=codec, transfer="t-1")
        return
    slow = list(
        iter_chunks(
            params_layout(spec),
            [a for W, b in zip(p.W, p.b, strict=True) for a in (W, b)],
            max_message_bytes=limit,
            codec=codec,
            transfer="t-1",
            rng=np.random.default_rng(seed),
            target_bytes=target,
            spans=spans,
        )
    )
    assert [encode(c) for c in fast] == [encode(c) for c in slow]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(block_st, min_size=1, max_size=4),
    st.integers(1024, 4000),
    st.integers(4000, 20000),
    st.booleans(),
)
def test_target_bytes_bounds_frames_except_single_rows(shapes, target, limit, spans):
    arrays = {f"a{i}": np.ones(s, dtype=np.float32) for i, s in enumerate(shapes)}
    try:
        chunks = chunk_named(
            arrays, max_message_bytes=limit, transfer="t", target_bytes=target, spans=spans
        )
    except ValueError:
        return  # one row above the hard limit: covered by the test above
    for c in chunks:
        n = len(encode(c))
        assert n <= limit
        # a row over the target goes alone
        assert n <= target or (c.blocks == 1 and c.row_end - c.row_start == 1)
    untargeted = chunk_named(arrays, max_message_bytes=limit, transfer="t", spans=spans)
    assert len(chunks) >= len(untargeted)
    if spans:  # never more frames than without spans
        plain = chunk_named(arrays, max_message_bytes=limit, transfer="t", target_bytes=target)
        assert len(chunks) <= len(plain)


def test_a_large_model_on_a_roblox_link_goes_in_frames_of_one_burst():
    p = _params("large")
    target = profile("roblox").frame_bytes
    frames = encode_params(p, max_message_bytes=16 << 20, transfer="m", target_bytes=target)
    assert max(map(len, frames)) <= target
    r = Reassembler.for_params(p.spec, transfer="m", total=len(frames))
    for f in frames:
        r.add(decode(f))
    assert r.params().array_equal(p)


def test_trusted_chunks_equal_checked_ones_and_transfer_is_still_checked():
    p = _params("medium", seed=2)
    chunks = chunk_params(p, max_message_bytes=8192, transfer="m-7", target_bytes=4096)
    for c in chunks:
        checked = Chunk(**{name: getattr(c, name) for name in Chunk.SCHEMA})
        assert checked == c and encode(checked) == encode(c)
    with pytest.raises(ValueError, match=r"chunk\.transfer"):
        chunk_params(p, max_message_bytes=8192, transfer="")


# -- chunks spanning blocks (docs/protocol.md §5.3) ---------------------------------------


def test_a_small_model_with_spans_is_one_frame():
    p = _params("small", seed=4)
    plain = chunk_params(p, max_message_bytes=1 << 16, transfer="m")
    spanned = chunk_params(p, max_message_bytes=1 << 16, transfer="m", spans=True)
    assert len(plain) == 2 * p.spec.num_layers and len(spanned) == 1
    (c,) = spanned
    assert (c.layer, c.part, c.row_start, c.blocks) == (0, "W", 0, 2 * p.spec.num_layers)
    assert c.row_end == p.spec.widths[-1]  # the last block (the output biases) ends it
    assert bytes(c.payload) == p.data.tobytes()  # fp32 pieces are adjacent in the buffer
    r = Reassembler.for_params(p.spec, transfer="m", total=1)
    r.add(decode(encode(c)))
    assert r.params().array_equal(p)


def test_spans_fill_each_frame_before_starting_the_next():
    p = _params("medium", seed=5)
    limit = 6000
    chunks = chunk_params(p, max_message_bytes=limit, transfer="m", spans=True)
    frames = [encode(c) for c in chunks]
    assert all(len(f) <= limit for f in frames)
    assert any(c.blocks > 1 for c in chunks) and any(c.row_start > 0 for c in chunks)
    # greedy: every frame but the last lacks room for the next row (a W row is 128 floats)
    assert all(len(f) > limit - 24 - 4 * 128 for f in frames[:-1])
    assert len(chunks) < len(chunk_params(p, max_message_bytes=limit, transfer="m"))
    r = Reassembler.for_params(p.spec, transfer="m", total=len(chunks))
    for f in reversed(frames):
        r.add(decode(f))
    assert r.params().array_equal(p)


def test_frames_without_spans_never_carry_the_blocks_key():
    p = _params("small")
    for c in chunk_params(p, max_message_bytes=300, transfer="m"):
        assert b"blocks" not in encode(c)
    (c,) = chunk_params(p, max_message_bytes=1 << 16, transfer="m", spans=True)
    assert decode(encode(c)).blocks == c.blocks > 1


def _spanning_chunk(**change):
    p = _params("tiny", seed=6)
    (c,) = chunk_params(p, max_message_bytes=4096, transfer="m", spans=True)
    fields = {name: getattr(c, name) for name in Chunk.SCHEMA}
    fields.update(change)
    if "payload" in change:
        fields["crc"] = crc32(fields["payload"])
    return p.spec, c, Chunk(**fields)


@pytest.mark.parametrize(
    ("change", "code", "text"),
    [
        ({"blocks": 9}, ErrorCode.BAD_CHUNK, "spans 9 blocks"),
        ({"row_end": 4}, ErrorCode.BAD_CHUNK, "out of range"),
        ({"row_start": 5}, ErrorCode.BAD_CHUNK, "out of range"),
        ({"payload": b"\0" * 428}, ErrorCode.BAD_CHUNK, "encode to 432"),
        ({"layer": 1, "blocks": 6, "row_end": 3}, ErrorCode.BAD_CHUNK, "payload of 432"),
    ],
)
def test_reassembler_rejects_bad_spanning_chunks(change, code, text):
    spec, good, bad = _spanning_chunk(**change)
    r = Reassembler.for_params(spec, transfer="m", total=1)
    with pytest.raises(ProtocolError) as info:
        r.add(bad)
    assert info.value.code == code and text in info.value.message
    r.add(good)  # the refused chunk changed nothing
    assert r.done


def test_a_spanning_chunk_that_overlaps_a_later_block_is_a_conflict():
    p = _params("tiny", seed=7)
    single = chunk_params(p, max_message_bytes=4096, transfer="m")
    (whole,) = chunk_params(p, max_message_bytes=4096, transfer="m", spans=True)
    r = Reassembler.for_params(p.spec, transfer="m", total=len(single))
    r.add(single[3])  # block (1, "b")
    with pytest.raises(ProtocolError) as info:
        r.add(Chunk(**{**{n: getattr(whole, n) for n in Chunk.SCHEMA}, "total": len(single)}))
    assert info.value.code == ErrorCode.CONFLICT and "(1, 'b')" in info.value.message
    assert r.missing()[0] == (0, "W", 0, 5)  # nothing of the refused chunk was kept


def test_blocks_field_is_checked_on_the_wire():
    _, c, _ = _spanning_chunk()
    wire = c.to_wire()
    for bad in (0, -1, "2", 1 << 20):
        with pytest.raises(ProtocolError) as info:
            decode(msgpack.packb({**wire, "blocks": bad}))
        assert "chunk.blocks" in info.value.message
    # one block keeps the single-block rule: row_end must pass row_start
    with pytest.raises(ProtocolError, match=r"chunk\.row_end"):
        decode(msgpack.packb({**wire, "blocks": 1, "row_start": 3, "row_end": 2}))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 12), min_size=2, max_size=5),
    st.integers(160, 1200),
    st.integers(0, 2**32 - 1),
    st.booleans(),
)
def test_fp32_chunks_land_in_the_flat_buffer_as_the_codec_would_place_them(
    widths, limit, seed, spans
):
    """A params reassembler copies an fp32 chunk's payload into the flat buffer in
    one piece (the hot path of every result); the codec's per-block decode is not
    called, and the values are where the general path puts them."""
    spec = ModelSpec(widths=tuple(widths))
    values = np.random.default_rng(seed).standard_normal(spec.num_params).astype(np.float32)
    p = Params.from_flat(spec, values)
    try:
        chunks = chunk_params(p, max_message_bytes=limit, transfer="t", spans=spans)
    except ValueError:
        return  # one row cannot fit this limit
    frames = [encode(c) for c in chunks]
    random.Random(seed).shuffle(frames)
    general = Reassembler(params_layout(spec), transfer="t", total=len(chunks))  # no buffer
    fast = Reassembler.for_params(spec, transfer="t", total=len(chunks))
    decode_calls = []
    fp32 = codecs.get("fp32")
    real = type(fp32).decode
    try:
        type(fp32).decode = lambda self, *a: decode_calls.append(a) or real(self, *a)
        for f in frames:
            fast.add(decode(f))
        assert not decode_calls
    finally:
        type(fp32).decode = real
    for f in frames:
        general.add(decode(f))
    assert fast.done and general.done
    assert fast.params().data.tobytes() == p.data.tobytes()
    flat = np.concatenate([a.ravel() for a in general.arrays().values()])
    assert flat.tobytes() == p.data.tobytes()
