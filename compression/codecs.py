"""Update codecs: how a float32 block of a model or delta is turned into bytes.

Every codec is a stateless object behind a three-method base (``encode``,
``decode``, ``encoded_size``) with a wire id from :class:`CodecId`; the registry is
an explicit dict and an import-time check makes sure every wire id has exactly one
codec. Stateful tricks (error feedback) wrap a codec; they are not codecs.

A block is what one protocol chunk carries: the W rows of a neuron group
(2-D, ``rows × in``) or its biases (1-D). Per-row codecs treat a 1-D block as one
row. ``decode`` must never trust the payload: a wrong length, an out-of-range
index or a non-finite scale raises :class:`CodecError`, which the protocol turns
into a ``ProtocolError``.

Byte layouts are written in each codec's docstring with ``struct`` formats; all
multi-byte values are little-endian.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod

import numpy as np


class CodecError(ValueError):
    """A payload does not decode: wrong size, bad header, out-of-range values."""


class CodecId(enum.IntEnum):
    """Wire ids of the codecs (docs/protocol.md, "Codecs"). Never renumber."""

    FP32 = 0


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

    def __repr__(self) -> str:
        return f"<codec {self.name}>"


def _as_block(x: np.ndarray) -> np.ndarray:
    if x.dtype != np.float32:
        raise CodecError(f"codec input must be float32, got {x.dtype}")
    if x.ndim not in (1, 2):
        raise CodecError(f"codec input must be 1-D or 2-D, got {x.ndim}-D")
    return np.ascontiguousarray(x)


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        if s < 0:
            raise CodecError(f"negative dimension in shape {shape}")
        n *= s
    return n


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


_REGISTRY: dict[str, Codec] = {}
_BY_ID: dict[int, Codec] = {}


def register(codec: Codec) -> Codec:
    """Add a codec; a duplicate name or wire id is a programming error."""
    if codec.name in _REGISTRY or int(codec.id) in _BY_ID:
        raise RuntimeError(f"codec {codec.name!r} / id {int(codec.id)} registered twice")
    _REGISTRY[codec.name] = codec
    _BY_ID[int(codec.id)] = codec
    return codec


def get(name_or_id: str | int) -> Codec:
    """Look a codec up by name or wire id; an unknown one raises CodecError."""
    table = _REGISTRY if isinstance(name_or_id, str) else _BY_ID
    try:
        return table[name_or_id]  # type: ignore[index]
    except KeyError:
        raise CodecError(f"unknown codec {name_or_id!r}; known: {sorted(_REGISTRY)}") from None


def names() -> list[str]:
    return sorted(_REGISTRY)


register(Fp32())


def check_registry() -> None:
    """Every wire id has exactly one codec (run at import of ``compression``)."""
    missing = [c.name for c in CodecId if int(c) not in _BY_ID]
    if missing:
        raise RuntimeError(f"codec ids without a codec: {missing}")
