"""The shard file round-trips exactly and refuses anything else (docs/protocol.md §13)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from protocol.shardfile import HEADER, ShardError, decode_shard, encode_shard, shard_size

finite = st.floats(-1e6, 1e6, allow_nan=False, width=32)


@settings(max_examples=60, deadline=None)
@given(
    X=hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, max_side=9), elements=finite),
    classes=st.integers(1, 50),
    data=st.data(),
)
def test_labelled_shards_round_trip(X, classes, data) -> None:
    y = data.draw(hnp.arrays(np.int32, (X.shape[0],), elements=st.integers(0, classes - 1)))
    blob = encode_shard(X, y, classes=classes)
    assert len(blob) == shard_size(X.shape[0], X.shape[1], 0)
    out = decode_shard(blob)
    assert out.classes == classes
    np.testing.assert_array_equal(out.X, X)
    np.testing.assert_array_equal(out.y, y)
    assert encode_shard(out.X, out.y, classes=classes) == blob  # canonical bytes


def test_float_targets_round_trip_and_header_fields() -> None:
    X = np.arange(6, dtype=np.float32).reshape(3, 2)
    y = np.array([[0.5, 1.0], [2.0, -1.0], [0.0, 0.25]], np.float32)
    blob = encode_shard(X, y)
    assert HEADER.unpack_from(blob) == (b"CGSHARD1", 3, 2, 2, 0)
    out = decode_shard(blob)
    np.testing.assert_array_equal(out.y, y)
    assert out.classes == 0


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda b: b[:10], "shorter than its 24-byte header"),
        (lambda b: b"CGSHARD2" + b[8:], "magic"),
        (lambda b: b + b"\x00\x00\x00\x00", "the header promises"),
        (lambda b: b[:-4] + np.int32(7).tobytes(), "outside [0, 3)"),
        (lambda b: b[:24] + np.float32(np.nan).tobytes() + b[28:], "X contains NaN"),
        (lambda b: b[:8] + (0).to_bytes(4, "little") + b[12:], "rows 0"),
    ],
)
def test_bad_blobs_are_refused(mutate, message: str) -> None:
    blob = encode_shard(np.ones((2, 2)), np.array([0, 2]), classes=3)
    with pytest.raises(ShardError) as err:
        decode_shard(mutate(blob))
    assert message in str(err.value)
