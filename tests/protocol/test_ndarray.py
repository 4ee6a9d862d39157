import struct

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import ErrorCode, ProtocolError
from protocol.ndarray import (
    DTYPES,
    MAX_ELEMENTS,
    NDARRAY_EXT,
    ext_hook,
    pack_ndarray,
    unpack_ndarray,
)


@pytest.mark.parametrize("dtype", [dt.name for dt in DTYPES.values()])
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 5), (2, 3, 4), (1, 2, 1, 3)])
def test_round_trip_every_dtype_and_rank(dtype, shape):
    rng = np.random.default_rng(1)
    a = (rng.standard_normal(shape) * 50).astype(dtype)
    ext = pack_ndarray(a)
    assert ext.code == NDARRAY_EXT
    b = unpack_ndarray(ext.data)
    assert b.dtype == a.dtype and b.shape == a.shape
    assert np.array_equal(a, b)


def test_decode_is_a_zero_copy_aligned_view():
    a = np.arange(1000, dtype=np.float32).reshape(10, 100)
    frame = msgpack.packb({"x": pack_ndarray(a)})
    b = msgpack.unpackb(frame, ext_hook=ext_hook)["x"]
    assert b.flags.aligned and not b.flags.owndata and not b.flags.writeable
    assert isinstance(b.base, bytes | memoryview) or b.base is not None
    assert np.array_equal(a, b)


def test_byte_layout_is_as_documented():
    ext = pack_ndarray(np.array([[1, 2, 3]], dtype=np.int8))
    # docs/protocol.md §4: "<BBH" dtype=2 ndim=2 reserved=0, "<2I" shape, data
    assert ext.data == struct.pack("<BBH2I", 2, 2, 0, 1, 3) + b"\x01\x02\x03"


def test_non_contiguous_and_big_endian_inputs_are_normalised():
    a = np.arange(20, dtype=">f4").reshape(4, 5)[:, ::2]
    b = unpack_ndarray(pack_ndarray(a).data)
    assert b.dtype == np.dtype("<f4") and np.array_equal(a, b)


def test_caller_errors_are_type_and_value_errors():
    with pytest.raises(TypeError, match="float64"):
        pack_ndarray(np.zeros(3))
    with pytest.raises(ValueError, match="dimensions"):
        pack_ndarray(np.zeros((1,) * 5, dtype=np.float32))


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"\x00", ErrorCode.MALFORMED),
        (struct.pack("<BBH", 9, 1, 0), ErrorCode.BAD_FIELD),  # dtype not allowed
        (struct.pack("<BBH", 0, 5, 0), ErrorCode.BAD_FIELD),  # ndim > 4
        (struct.pack("<BBH", 0, 1, 7), ErrorCode.BAD_FIELD),  # reserved != 0
        (struct.pack("<BBH", 0, 2, 0) + b"\x01\x00\x00\x00", ErrorCode.MALFORMED),  # shape cut
        (struct.pack("<BBHI", 0, 1, 0, 3) + b"\x00" * 11, ErrorCode.MALFORMED),  # data short
        (struct.pack("<BBH2I", 0, 2, 0, 2**32 - 1, 2**32 - 1), ErrorCode.TOO_LARGE),
        (struct.pack("<BBHI", 3, 1, 0, MAX_ELEMENTS + 1), ErrorCode.TOO_LARGE),
    ],
)
def test_bad_ext_payloads_raise_protocol_error(data, code):
    with pytest.raises(ProtocolError) as info:
        unpack_ndarray(data)
    assert info.value.code == code


def test_unknown_ext_type_is_malformed():
    with pytest.raises(ProtocolError) as info:
        ext_hook(42, b"")
    assert info.value.code == ErrorCode.MALFORMED


@given(st.binary(max_size=64))
def test_arbitrary_ext_payloads_raise_only_protocol_error(data):
    try:
        arr = unpack_ndarray(data)
    except ProtocolError:
        return
    assert arr.dtype in DTYPES.values()
