"""Zero-copy reader for *flat* msgpack maps: the fast path for large chunk frames.

msgpack-python copies every bin value out of the frame. For a chunk frame that is
a megabyte of payload behind a hundred bytes of header, that copy is a third of
the decode time. A chunk is a flat map (str keys; nil, bool, int, float, str or
bin values), so this reader walks it in Python and returns bin values as
``memoryview`` slices of the frame.

Contract: ``read_flat_map(frame)`` returns exactly what
``msgpack.unpackb(frame, raw=False, strict_map_key=True)`` would (bin values as
memoryviews instead of bytes), or None when the frame is anything else (nested,
an ext, a non-str key, invalid UTF-8, truncated, trailing bytes). None means
"use the general decoder", which then accepts it or raises the right error.
"""

from __future__ import annotations

import struct
from typing import Any

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")

#: Fixed-size scalars: first byte -> (struct, size after the type byte).
_FIXED: dict[int, struct.Struct] = {
    0xCA: _F32,
    0xCB: _F64,
    0xCC: _U8,
    0xCD: _U16,
    0xCE: _U32,
    0xCF: _U64,
    0xD0: _I8,
    0xD1: _I16,
    0xD2: _I32,
    0xD3: _I64,
}
#: Length-prefixed str (True) and bin (False): first byte -> (length struct, is_str).
_SIZED: dict[int, tuple[struct.Struct, bool]] = {
    0xD9: (_U8, True),
    0xDA: (_U16, True),
    0xDB: (_U32, True),
    0xC4: (_U8, False),
    0xC5: (_U16, False),
    0xC6: (_U32, False),
}


class _NotFlat(Exception):
    pass


def _value(mv: memoryview, pos: int) -> tuple[Any, int]:
    n = len(mv)
    if pos >= n:
        raise _NotFlat
    t = mv[pos]
    pos += 1
    if t <= 0x7F:
        return t, pos
    if t >= 0xE0:
        return t - 0x100, pos
    if 0xA0 <= t <= 0xBF:
        size, is_str = t - 0xA0, True
    elif t in _SIZED:
        fmt, is_str = _SIZED[t]
        if pos + fmt.size > n:
            raise _NotFlat
        size = fmt.unpack_from(mv, pos)[0]
        pos += fmt.size
    elif t in _FIXED:
        fmt = _FIXED[t]
        if pos + fmt.size > n:
            raise _NotFlat
        return fmt.unpack_from(mv, pos)[0], pos + fmt.size
    elif t == 0xC0:
        return None, pos
    elif t == 0xC2:
        return False, pos
    elif t == 0xC3:
        return True, pos
    else:  # containers, ext, 0xc1
        raise _NotFlat
    end = pos + size
    if end > n:
        raise _NotFlat
    if is_str:
        try:
            return str(mv[pos:end], "utf-8"), end
        except UnicodeDecodeError:
            raise _NotFlat from None
    return mv[pos:end], end


def read_flat_map(frame: bytes | bytearray | memoryview) -> dict[str, Any] | None:
    """The frame as a dict with zero-copy bin values, or None (see the module doc)."""
    mv = memoryview(frame).cast("B")
    if not len(mv):
        return None
    t = mv[0]
    if 0x80 <= t <= 0x8F:
        count, pos = t - 0x80, 1
    elif t == 0xDE and len(mv) >= 3:
        count, pos = _U16.unpack_from(mv, 1)[0], 3
    elif t == 0xDF and len(mv) >= 5:
        count, pos = _U32.unpack_from(mv, 1)[0], 5
    else:
        return None
    if count > len(mv):
        return None
    out: dict[str, Any] = {}
    try:
        for _ in range(count):
            key, pos = _value(mv, pos)
            if not isinstance(key, str):
                return None
            out[key], pos = _value(mv, pos)
    except _NotFlat:
        return None
    return out if pos == len(mv) else None
