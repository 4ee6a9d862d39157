"""Update codecs: how a float32 block of a model or delta is turned into bytes.

Every codec is a stateless object behind a three-method base (``encode``, ``decode``,
``encoded_size``) with a wire id from :class:`CodecId`; the registry is an explicit dict and an
import-time check makes sure every wire id has exactly one codec. Stateful tricks (error
feedback) wrap a codec; they are not codecs.

A block is what one protocol chunk carries: the W rows of a neuron group (2-D, ``rows × in``)
or its biases (1-D); per-row codecs treat a 1-D block as one row. ``decode`` must never trust
the payload: a wrong length, an out-of-range index or a non-finite scale raises
:class:`CodecError`, which the protocol turns into a ``ProtocolError``. Byte layouts are
written in each codec's docstring with ``struct`` formats, all little-endian.

Names: fixed codecs by name (``fp32``, ``fp16``, ``int8``, ...); parameterised ones in a small
grammar that :func:`get` parses: ``topk:0.01`` (keep the 1 % largest magnitudes),
``topk:0.01+int8``, and an ``-sr`` suffix on any integer codec for stochastic rounding
(``int8-sr``, ``topk:0.01+int8-sr``). Parameters and rounding only change what the encoder
chooses, never the byte layout, so the wire carries just the :class:`CodecId` and the
registered instance of that id decodes every variant (docs/protocol.md §11).
"""

from __future__ import annotations

import enum
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np


class CodecError(ValueError):
    """A payload does not decode: wrong size, bad header, out-of-range values."""


class CodecId(enum.IntEnum):
    """Wire ids of the codecs (docs/protocol.md, "Codecs"). Never renumber."""

    FP32 = 0
    FP16 = 1
    INT8 = 2
    INT4 = 3
    TOPK = 4
    TOPK_INT8 = 5
    INT8_CHUNK = 6
    INT4_CHUNK = 7
    INT2 = 8


class Codec(ABC):
    """Stateless float32-block codec."""

    id: CodecId
    name: str
    #: True when decode(encode(x)) == x bit for bit.
    lossless: bool = False

    @abstractmethod
    def encode(self, x: np.ndarray, *, rng: np.random.Generator | None = None) -> bytes:
        """Encode a float32 block (1-D or 2-D, C-contiguous)."""

    @abstractmethod
    def decode(self, payload: bytes | memoryview, shape: tuple[int, ...]) -> np.ndarray:
        """Decode to a float32 array of ``shape``; raise CodecError on a bad payload."""

    @abstractmethod
    def encoded_size(self, shape: tuple[int, ...]) -> int:
        """The exact number of payload bytes ``encode`` produces for ``shape``."""

    def payload_size(self, data: bytes | memoryview, shape: tuple[int, ...]) -> int:
        """How many leading bytes of ``data`` are the encoding of a ``shape`` block:
        how a chunk spanning several blocks is split (docs/protocol.md §5.3). The
        encoder's parameters do not travel, so a codec whose size depends on them
        (top-k's fraction) reads it from its header instead of ``encoded_size``."""
        return self.encoded_size(shape)

    def __repr__(self) -> str:
        return f"<codec {self.name}>"


def _as_block(x: np.ndarray) -> np.ndarray:
    if x.dtype != np.float32:
        raise CodecError(f"codec input must be float32, got {x.dtype}")
    if x.ndim not in (1, 2):
        raise CodecError(f"codec input must be 1-D or 2-D, got {x.ndim}-D")
    return np.ascontiguousarray(x)


def _count(shape: tuple[int, ...]) -> int:
    if len(shape) not in (1, 2):
        raise CodecError(f"block shape must be 1-D or 2-D, got {shape}")
    n = 1
    for s in shape:
        if not isinstance(s, int | np.integer) or s < 0:
            raise CodecError(f"bad dimension in shape {shape}")
        n *= int(s)
    return n


block_size = _count


class Fp32(Codec):
    """Raw float32, little-endian: ``<{n}f``. Lossless; decode is a zero-copy view."""

    id = CodecId.FP32
    name = "fp32"
    lossless = True

    def encode(self, x: np.ndarray, *, rng: np.random.Generator | None = None) -> bytes:
        return _as_block(x).astype("<f4", copy=False).tobytes()

    def decode(self, payload: bytes | memoryview, shape: tuple[int, ...]) -> np.ndarray:
        n = _count(shape)
        if len(payload) != 4 * n:
            raise CodecError(f"fp32 payload has {len(payload)} bytes, shape {shape} needs {4 * n}")
        return np.frombuffer(payload, dtype="<f4", count=n).reshape(shape)

    def encoded_size(self, shape: tuple[int, ...]) -> int:
        return 4 * _count(shape)


class Fp16(Codec):
    """IEEE half precision: ``<{n}e``.

    Values beyond the half range (±65504) are clipped rather than turned into inf,
    so a finite block always decodes finite; the relative error is at most 2**-11
    (absolute 2**-25 in the subnormal range).
    """

    id = CodecId.FP16
    name = "fp16"

    def encode(self, x: np.ndarray, *, rng: np.random.Generator | None = None) -> bytes:
        x = _as_block(x)
        check_finite(x, self.name)
        return np.clip(x, -65504.0, 65504.0).astype("<f2").tobytes()

    def decode(self, payload: bytes | memoryview, shape: tuple[int, ...]) -> np.ndarray:
        n = _count(shape)
        if len(payload) != 2 * n:
            raise CodecError(f"fp16 payload has {len(payload)} bytes, shape {shape} needs {2 * n}")
        out = np.frombuffer(payload, dtype="<f2", count=n).astype(np.float32).reshape(shape)
        if not np.isfinite(out).all():
            raise CodecError("fp16 payload holds non-finite values")
        return out

    def encoded_size(self, shape: tuple[int, ...]) -> int:
        return 2 * _count(shape)


#: Lossy codecs refuse larger magnitudes: a scale near float32's maximum could
#: round up and decode to inf. No sane update or weight comes near it.
MAX_MAGNITUDE = 1e38


def check_finite(x: np.ndarray, codec: str) -> None:
    """Lossy codecs scale by the block's magnitude; one inf or NaN would poison it."""
    if x.size and not np.max(np.abs(x)) <= MAX_MAGNITUDE:
        raise CodecError(f"{codec}: input block holds non-finite values (or |x| > 1e38)")


def block_rows(shape: tuple[int, ...]) -> int:
    """Rows of a block for per-row codecs: a 1-D block (biases) is one row."""
    _count(shape)
    return shape[0] if len(shape) == 2 else 1


def default_rng(x: np.ndarray) -> np.random.Generator:
    """Stochastic rounding without a caller rng: seeded by the block's own bytes.

    Deterministic (same block, same bytes) without touching global randomness;
    callers that want independent draws per round pass their own generator.
    """
    return np.random.default_rng(zlib.crc32(x.tobytes()))


_REGISTRY: dict[str, Codec] = {}
_BY_ID: dict[int, Codec] = {}
#: Parsers for parameterised names; each returns a codec or None if not its name.
_PARSERS: list[Callable[[str], Codec | None]] = []
_PARSED: dict[str, Codec] = {}


def register(codec: Codec) -> Codec:
    """Add a codec; a duplicate name or wire id is a programming error."""
    if codec.name in _REGISTRY or int(codec.id) in _BY_ID:
        raise RuntimeError(f"codec {codec.name!r} / id {int(codec.id)} registered twice")
    _REGISTRY[codec.name] = codec
    _BY_ID[int(codec.id)] = codec
    return codec


def register_parser(parser: Callable[[str], Codec | None]) -> None:
    """Add a parser for parameterised names (see the module docstring)."""
    _PARSERS.append(parser)


def get(name_or_id: str | int) -> Codec:
    """Look a codec up by name, parameterised name or wire id; unknown raises CodecError."""
    if isinstance(name_or_id, str):
        codec = _REGISTRY.get(name_or_id) or _PARSED.get(name_or_id)
        if codec is None:
            for parse in _PARSERS:
                codec = parse(name_or_id)
                if codec is not None:
                    _PARSED[name_or_id] = codec
                    break
    else:
        codec = _BY_ID.get(int(name_or_id)) if isinstance(name_or_id, int) else None
    if codec is None:
        raise CodecError(
            f"unknown codec {name_or_id!r}; known: {sorted(_REGISTRY)} "
            "or topk:FRACTION[+int8][-sr], int8|int4[-chunk][-sr], int2[-sr]"
        )
    return codec


def names() -> list[str]:
    return sorted(_REGISTRY)


register(Fp32())
register(Fp16())


def check_registry() -> None:
    """Every wire id has exactly one codec (run at import of ``compression``)."""
    missing = [c.name for c in CodecId if int(c) not in _BY_ID]
    if missing:
        raise RuntimeError(f"codec ids without a codec: {missing}")
