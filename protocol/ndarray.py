"""The ndarray msgpack extension type (docs/protocol.md §4).

An array travels as msgpack ext type ``NDARRAY_EXT = 1`` whose data is::

    header  struct "<BBH"        dtype code, ndim (0..4), reserved (must be 0)
    shape   struct "<{ndim}I"    one uint32 per dimension
    data    prod(shape) * itemsize bytes, C order, little-endian

The header is 4 + 4·ndim bytes, a multiple of every allowed item size, so the
data is aligned whenever the ext payload is, and decode returns a read-only
zero-copy view; otherwise (never with CPython's msgpack) it copies.
"""

from __future__ import annotations

import struct

import msgpack
import numpy as np

from protocol.errors import ErrorCode, ProtocolError

NDARRAY_EXT = 1
MAX_NDIM = 4
#: Largest element count accepted on decode: 64 Mi, four times the roblox frame.
MAX_ELEMENTS = 64 * 1024 * 1024

_HEADER = struct.Struct("<BBH")

#: Wire dtype codes (never renumber) -> little-endian numpy dtype.
DTYPES: dict[int, np.dtype] = {
    0: np.dtype("<f4"),
    1: np.dtype("<f2"),
    2: np.dtype("i1"),
    3: np.dtype("u1"),
    4: np.dtype("<i4"),
    5: np.dtype("<u4"),
}
_CODES: dict[str, int] = {dt.name: code for code, dt in DTYPES.items()}
#: The array header per (dtype, shape) seen; a coordinator packs the same few
#: shapes (a shard's sample indices) once per task.
_HEADS: dict[tuple[np.dtype, tuple[int, ...]], bytes] = {}


def pack_ndarray(arr: np.ndarray) -> msgpack.ExtType:
    """An allowed-dtype array as an ExtType; a disallowed one is the caller's bug."""
    if type(arr) is np.ndarray and arr.flags.c_contiguous:  # the common case
        head = _HEADS.get((arr.dtype, arr.shape))
        if head is not None:
            return msgpack.ExtType(NDARRAY_EXT, head + arr.tobytes())
    a = np.asarray(arr)
    code = _CODES.get(a.dtype.name)
    if code is None:
        raise TypeError(f"ndarray: dtype {a.dtype} not allowed; allowed: {sorted(_CODES)}")
    if a.ndim > MAX_NDIM:
        raise ValueError(f"ndarray: {a.ndim} dimensions, at most {MAX_NDIM}")
    if a.size > MAX_ELEMENTS:
        raise ValueError(f"ndarray: {a.size} elements, at most {MAX_ELEMENTS}")
    data = np.ascontiguousarray(a, dtype=DTYPES[code])
    head = _HEADER.pack(code, a.ndim, 0) + struct.pack(f"<{a.ndim}I", *a.shape)
    if data is a and len(_HEADS) < 4096:
        _HEADS[(a.dtype, a.shape)] = head
    return msgpack.ExtType(NDARRAY_EXT, head + data.tobytes())


def unpack_ndarray(data: bytes, *, where: str = "ndarray") -> np.ndarray:
    """Inverse of ``pack_ndarray``; any inconsistency is the peer's ProtocolError."""
    if len(data) < _HEADER.size:
        raise ProtocolError(ErrorCode.MALFORMED, f"{where}: ext of {len(data)} bytes is too short")
    code, ndim, reserved = _HEADER.unpack_from(data)
    dtype = DTYPES.get(code)
    if dtype is None:
        raise ProtocolError(ErrorCode.BAD_FIELD, f"{where}: dtype code {code} not allowed")
    if ndim > MAX_NDIM or reserved:
        raise ProtocolError(
            ErrorCode.BAD_FIELD, f"{where}: ndim {ndim} / reserved {reserved} invalid"
        )
    start = _HEADER.size + 4 * ndim
    if len(data) < start:
        raise ProtocolError(ErrorCode.MALFORMED, f"{where}: shape truncated")
    shape = struct.unpack_from(f"<{ndim}I", data, _HEADER.size)
    count = 1
    for s in shape:
        count *= s
    if count > MAX_ELEMENTS:
        raise ProtocolError(
            ErrorCode.TOO_LARGE, f"{where}: {count} elements exceed the limit of {MAX_ELEMENTS}"
        )
    if len(data) - start != count * dtype.itemsize:
        raise ProtocolError(
            ErrorCode.MALFORMED,
            f"{where}: shape {list(shape)} of {dtype.name} needs {count * dtype.itemsize} "
            f"data bytes, got {len(data) - start}",
        )
    out = np.frombuffer(data, dtype=dtype, count=count, offset=start).reshape(shape)
    if not out.flags.aligned:
        out = out.copy()
    return out


def ext_hook(code: int, data: bytes) -> object:
    """msgpack ``ext_hook``: arrays for ours, an error for any other ext type."""
    if code == NDARRAY_EXT:
        return unpack_ndarray(data)
    raise ProtocolError(ErrorCode.MALFORMED, f"unknown msgpack ext type {code}")
