import zlib

from hypothesis import given
from hypothesis import strategies as st

from protocol.checksum import BACKEND, crc32


def test_standard_check_value():
    # The CRC-32/ISO-HDLC check value every implementation must reproduce.
    assert crc32(b"123456789") == 0xCBF43926
    assert BACKEND in ("isal", "zlib-ng", "zlib")


@given(st.binary(max_size=4096))
def test_matches_zlib_on_any_bytes(data):
    assert crc32(data) == zlib.crc32(data)
    assert crc32(memoryview(data)) == zlib.crc32(data)
