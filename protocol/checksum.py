"""CRC-32 (IEEE 802.3, the zlib/PNG/gzip polynomial) of chunk payloads.

Python's zlib computes it at about 2 GB/s, which is slower than everything else
the codec does to a large chunk. ISA-L (package ``isal``) and zlib-ng (package
``zlib-ng``) compute the same function with carry-less multiplication at several
times that; whichever is installed is used. Results are identical by definition.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

crc32: Callable[..., int]
try:  # pragma: no cover - depends on what is installed
    from isal.isal_zlib import crc32  # type: ignore[import-not-found,no-redef]

    BACKEND = "isal"
except ImportError:  # pragma: no cover
    try:
        from zlib_ng.zlib_ng import crc32  # type: ignore[import-not-found,no-redef]

        BACKEND = "zlib-ng"
    except ImportError:
        crc32 = zlib.crc32
        BACKEND = "zlib"

__all__ = ["BACKEND", "crc32"]
