import msgpack
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nn.spec import ModelSpec
from protocol.chunking import encode_params
from protocol.flatmap import read_flat_map
from protocol.messages import FLAT_MAP_MIN_BYTES, Chunk, decode

scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=300),
    st.binary(max_size=70_000),
)
flat = st.dictionaries(st.text(max_size=40), scalar, max_size=20)


def _plain(d):
    return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in d.items()}


@settings(max_examples=200, deadline=None)
@given(flat)
def test_agrees_with_msgpack_on_flat_maps(d):
    frame = msgpack.packb(d, use_bin_type=True)
    got = read_flat_map(frame)
    assert got is not None
    assert _plain(got) == msgpack.unpackb(frame, raw=False, strict_map_key=True)


@given(st.dictionaries(st.text(max_size=5), st.floats(width=32, allow_nan=False), max_size=5))
def test_reads_float32(d):
    frame = msgpack.packb(d, use_single_float=True)
    assert read_flat_map(frame) == msgpack.unpackb(frame)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_are_read_as_msgpack_reads_them_or_refused(data):
    got = read_flat_map(data)
    if got is None:
        return
    assert _plain(got) == msgpack.unpackb(data, raw=False, strict_map_key=True)


def test_refuses_what_is_not_a_flat_map():
    for obj in ([1], {"a": [1]}, {"a": {"b": 1}}, {1: 2}, 5):
        assert read_flat_map(msgpack.packb(obj)) is None
    assert read_flat_map(msgpack.packb({"a": 1}) + b"\x00") is None  # trailing byte
    assert read_flat_map(msgpack.packb({"a": b"xyz"})[:-1]) is None  # truncated
    assert read_flat_map(b"\x81\xa1a\xa2\xff\xfe") is None  # invalid UTF-8
    assert read_flat_map(b"") is None


def test_large_chunk_payload_is_a_view_into_the_frame():
    p = ModelSpec(widths=(256, 256)).init_params(0)
    frames = encode_params(p, max_message_bytes=1 << 20, transfer="m")
    big = frames[0]
    assert len(big) >= FLAT_MAP_MIN_BYTES
    chunk = decode(big)
    assert isinstance(chunk, Chunk) and isinstance(chunk.payload, memoryview)
    assert chunk.payload.obj is big  # no copy
    assert np.frombuffer(chunk.payload, "<f4").tobytes() == p.W[0].tobytes()
