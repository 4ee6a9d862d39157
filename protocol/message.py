"""The base of every wire message: a frozen dataclass checked field by field.

A subclass sets ``TYPE`` (its wire name) and ``SCHEMA`` (one check per field,
protocol/checks.py); ``finish`` binds them once all are defined. Constructing a
message with a bad field is the caller's ValueError; ``from_wire`` raises the
peer's ProtocolError naming the field. ``trusted`` skips the per-field checks
for values this process derived from checked inputs (the hot path).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar

import numpy as np

from protocol.checks import DUMP, Check
from protocol.errors import ErrorCode, ProtocolError

PROTOCOL_VERSION = 1
#: Versions this implementation can speak; a hello offering a higher one is
#: answered with the highest of these below it (``choose_version``, §6, §9).
SUPPORTED_VERSIONS = (1,)
#: Seconds a server waits for a new connection's ``hello`` before it closes it
#: with ``TIMEOUT`` (docs/protocol.md §6; the one place this number lives).
HELLO_TIMEOUT_S = 30.0
#: Largest integer a JavaScript number holds exactly (2^53 - 1): every integer
#: a server sends stays at or below it, so a browser client needs no BigInt (§1).
MAX_SAFE_INT = 2**53 - 1
#: ``bye.reason`` of a server whose job is over: the client must not reconnect (§3.9).
BYE_FINISHED = "finished"
#: Task kinds this version knows; ``task.kind`` must be one of them.
TASK_KINDS = ("train", "gradient", "evaluate", "distill")

#: Frames at least this large try the zero-copy flat-map reader first (chunks).
FLAT_MAP_MIN_BYTES = 128 * 1024

#: Most blocks one chunk may span (``chunk.blocks``): 2 per layer, 65536 layers.
MAX_CHUNK_BLOCKS = 1 << 17


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Message:
    """Base of all messages; subclasses set TYPE and SCHEMA (one check per field)."""

    TYPE: ClassVar[str] = ""
    SCHEMA: ClassVar[dict[str, Check]] = {}
    #: per field ``(name, check, where, dump)`` in field order, filled in once below
    #: the classes: ``dataclasses.fields`` per message was a third of building one
    _PLAN: ClassVar[tuple[tuple[str, Check, str, Callable[[Any], Any] | None], ...]] = ()
    #: per field ``(name, where, default)``: ``default`` makes the value when the
    #: field is left out, or is None for a required field
    _FILL: ClassVar[tuple[tuple[str, str, Callable[[], Any] | None], ...]] = ()
    #: keys added within version 1 that the encoder leaves off the wire at their
    #: default, so a peer that never uses them sends and gets the frames it always did
    SPARSE: ClassVar[frozenset[str]] = frozenset()
    #: the wire value of each SPARSE key at its default (what the encoder leaves off)
    _SPARSE_AT: ClassVar[dict[str, Any]] = {}

    def __post_init__(self) -> None:
        try:
            for name, check, where, _ in self._PLAN:
                object.__setattr__(self, name, check(getattr(self, name), where))
            self._cross()
        except ProtocolError as exc:
            raise ValueError(exc.message) from None

    def _cross(self) -> None:
        """Checks between fields; raise ProtocolError(BAD_FIELD)."""

    @classmethod
    def trusted(cls, **values: Any) -> Message:
        """Build from values this process derived from already-checked inputs: the
        per-field checks are skipped, the cross-field ones run, left-out fields take
        their defaults.

        For the hot path only (chunking builds several chunks per result and task,
        the core a task and an ack per result); tests/protocol/test_chunking.py and
        tests/coordinator/test_core.py hold what they build equal to the checked
        construction. Anything a peer sent goes through ``decode`` instead.
        """
        msg = object.__new__(cls)
        for name, where, default in cls._FILL:
            if name in values:
                v = values[name]
            elif default is None:
                raise TypeError(f"{where}: missing required field")
            else:
                v = default()
            object.__setattr__(msg, name, v)
        msg._cross()
        return msg

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.TYPE}
        for name, _, _, dump in self._PLAN:
            v = getattr(self, name)
            out[name] = dump(v) if dump is not None and v is not None else v
        for name in self.SPARSE:
            v = out[name]
            if not isinstance(v, np.ndarray) and v == self._SPARSE_AT[name]:
                del out[name]
        return out

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> Message:
        msg = object.__new__(cls)
        schema = cls.SCHEMA
        for name, where, default in cls._FILL:
            if name in obj:
                v = schema[name](obj[name], where)
            elif default is None:
                raise ProtocolError(ErrorCode.BAD_FIELD, f"{where}: missing required field")
            else:
                v = default()
            object.__setattr__(msg, name, v)
        msg._cross()
        return msg

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
                    return False
                if a.dtype != b.dtype or not np.array_equal(a, b):
                    return False
            elif isinstance(a, memoryview | bytearray) or isinstance(b, memoryview | bytearray):
                if bytes(a) != bytes(b):
                    return False
            elif a != b:
                return False
        return True

    __hash__ = None  # type: ignore[assignment]


def _filler(f: Any) -> Callable[[], Any] | None:
    """What makes a left-out field's value (None: the field is required)."""
    if f.default is not MISSING:
        default = f.default
        return lambda: default
    if f.default_factory is not MISSING:
        return f.default_factory  # type: ignore[no-any-return]
    return None


def finish(*classes: type[Message]) -> dict[str, type[Message]]:
    """Bind each message class's checks to its fields, in field order; by wire type."""
    by_type: dict[str, type[Message]] = {}
    for cls in classes:  # every dataclass field has exactly one check
        if set(cls.SCHEMA) != {f.name for f in fields(cls)}:
            raise RuntimeError(f"{cls.__name__}: SCHEMA does not match the fields")
        cls._PLAN = tuple(
            (f.name, cls.SCHEMA[f.name], f"{cls.TYPE}.{f.name}", DUMP.get(f.name))
            for f in fields(cls)
        )
        cls._FILL = tuple((f.name, f"{cls.TYPE}.{f.name}", _filler(f)) for f in fields(cls))
        cls._SPARSE_AT = {f.name: f.default for f in fields(cls) if f.name in cls.SPARSE}
        by_type[cls.TYPE] = cls
    return by_type
