"""Protocol messages: typed, validated, one msgpack map per websocket binary frame.

Every message is a frozen dataclass with a wire ``type`` string and a schema
(field name -> check). Constructing a message with a bad field is the caller's
ValueError; decoding a frame with one is the peer's ProtocolError naming the field
(``task.steps: expected int in [1, 1000000000], got 'x'``). Unknown extra keys
are ignored so that a newer peer can add optional fields (docs/protocol.md §9).
Field tables: docs/protocol.md §3. The base class is in message.py, the field
checks in checks.py, the ``task`` message (the largest) in taskmsg.py; every
name is importable from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack
import numpy as np

from protocol import checks as ck
from protocol.checks import I64 as I64
from protocol.checks import U32 as U32
from protocol.checks import U64 as U64
from protocol.checks import Check
from protocol.errors import ErrorCode, ProtocolError
from protocol.flatmap import read_flat_map
from protocol.limits import LinkLimits
from protocol.message import BYE_FINISHED as BYE_FINISHED
from protocol.message import FLAT_MAP_MIN_BYTES as FLAT_MAP_MIN_BYTES
from protocol.message import HELLO_TIMEOUT_S as HELLO_TIMEOUT_S
from protocol.message import MAX_CHUNK_BLOCKS as MAX_CHUNK_BLOCKS
from protocol.message import MAX_SAFE_INT as MAX_SAFE_INT
from protocol.message import PROTOCOL_VERSION as PROTOCOL_VERSION
from protocol.message import SUPPORTED_VERSIONS as SUPPORTED_VERSIONS
from protocol.message import TASK_KINDS as TASK_KINDS
from protocol.message import Message as Message
from protocol.message import finish
from protocol.ndarray import ext_hook, pack_ndarray
from protocol.taskmsg import Task as Task


def choose_version(offered: int) -> int:
    """The version to speak with a client whose hello offers ``offered`` (§9)."""
    usable = [v for v in SUPPORTED_VERSIONS if v <= offered]
    if not usable:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"hello.version: {offered} is older than every supported version "
            f"{list(SUPPORTED_VERSIONS)}",
        )
    return max(usable)


#: The §12 kernel families a client may name in ``hello.kernel`` (docs/protocol.md
#: §3.1, §12.8): each is bit-exact with itself, so two results of one family that
#: differ prove one of them wrong. ``numba-f32`` is the Python client's (numba, float32
#: BLAS sums), which the reference coordinator also computes with; ``js-f64`` the
#: browser's plain JavaScript kernels (float64 sums); ``wasm-simd-f32`` its
#: WebAssembly SIMD kernels (float32 sums, another order).
KERNELS: tuple[str, ...] = ("numba-f32", "js-f64", "wasm-simd-f32")


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Hello(Message):
    """Client -> server, first frame: who I am and what link I ask for.
    ``deltas``: this client applies ``task.delta_base`` downloads. ``seeded_init``:
    it builds version 0 itself from ``task.init_seed`` with NumPy's PCG64 (the
    legacy scheme); ``init_schemes``: the portable init schemes it builds it with
    (docs/protocol.md §3.3, §12.3).
    ``spans``: it takes chunks that span several blocks (``chunk.blocks`` > 1, §5.3).
    ``boundary``: it returns a layer-split task's boundary activations (§3.3.2).
    ``kernel``: the §12 kernel family it computes with (``KERNELS``; "": unknown);
    a token of another family is valid and counts as unknown."""

    TYPE: ClassVar[str] = "hello"
    version: int = PROTOCOL_VERSION
    client: str
    platform: str = ""
    cores: int = 1
    memory: int = 0
    flops: float = 0.0
    limits: LinkLimits | None = None
    codecs: tuple[str, ...] = ("fp32",)
    token: str | None = None
    resume: str | None = None
    deltas: bool = False
    seeded_init: bool = False
    spans: bool = False
    data: bool = False
    init_schemes: tuple[str, ...] = ()
    boundary: bool = False
    #: the volunteer's secret key, the same across sessions (credit, §3.1); None: anonymous
    volunteer: str | None = None
    kernel: str = ""

    SPARSE: ClassVar[frozenset[str]] = frozenset(
        {"data", "init_schemes", "boundary", "volunteer", "kernel"}
    )
    SCHEMA: ClassVar[dict[str, Check]] = {
        "version": ck.int_in(0, 65535),
        "client": ck.str_of(64, empty=False),
        "platform": ck.str_of(64),
        "cores": ck.int_in(1, 4096),
        "memory": ck.int_in(0, I64),
        "flops": ck.float_in(0.0, 1e18),
        "limits": ck.optional(ck.limits),
        "codecs": ck.strs(32, 32),
        "token": ck.optional(ck.str_of(512)),
        "resume": ck.optional(ck.str_of(128)),
        "deltas": ck.boolean,
        "seeded_init": ck.boolean,
        "spans": ck.boolean,
        "data": ck.boolean,
        "init_schemes": ck.strs(8, 32),
        "boundary": ck.boolean,
        "volunteer": ck.optional(ck.str_of(128)),
        "kernel": ck.word(32),
    }


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Welcome(Message):
    """Server -> client answer to hello: the session and the limits it granted.
    ``spans``: the server takes result chunks that span several blocks (§5.3).
    ``prefetch``: the server answers ``prefetch`` with the next task early (§3.12).
    ``decline``: the server takes ``decline`` for a task the client cannot do (§3.13)."""

    TYPE: ClassVar[str] = "welcome"
    version: int = PROTOCOL_VERSION
    session_id: str
    resume_token: str = ""
    limits: LinkLimits
    heartbeat_interval: float = 5.0
    spans: bool = False
    prefetch: bool = False
    data: bool = False
    decline: bool = False
    #: the job's name, for the volunteer's console ("": not said)
    job: str = ""
    #: the public id of hello.volunteer's key, under which credit is kept ("": none)
    volunteer: str = ""

    SPARSE: ClassVar[frozenset[str]] = frozenset({"data", "decline", "job", "volunteer"})
    SCHEMA: ClassVar[dict[str, Check]] = {
        "version": ck.int_in(0, 65535),
        "session_id": ck.str_of(128, empty=False),
        "resume_token": ck.str_of(128),
        "limits": ck.limits,
        "heartbeat_interval": ck.float_in(0.001, 3600.0),
        "spans": ck.boolean,
        "prefetch": ck.boolean,
        "data": ck.boolean,
        "decline": ck.boolean,
        "job": ck.str_of(128),
        "volunteer": ck.str_of(16),
    }


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Result(Message):
    """Client -> server: a finished task; the update follows as ``num_chunks``
    chunks whose transfer is ``task_id``."""

    TYPE: ClassVar[str] = "result"
    task_id: str
    model_version: int
    kind: str = "train"
    num_chunks: int = 0
    loss: float | None = None
    samples: int = 0
    steps: int = 0
    compute_seconds: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)

    SCHEMA: ClassVar[dict[str, Check]] = {
        "task_id": ck.str_of(128, empty=False),
        "model_version": ck.int_in(0, I64),
        "kind": ck.str_of(32, TASK_KINDS),
        "num_chunks": ck.int_in(0, 1 << 24),
        "loss": ck.optional(ck.float_in(-1e300, 1e300, inf=True)),
        "samples": ck.int_in(0, I64),
        "steps": ck.int_in(0, I64),
        "compute_seconds": ck.float_in(0.0, 1e9),
        "metrics": ck.scalars(64, numbers_only=True),
    }


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Chunk(Message):
    """Rows ``[row_start, row_end)`` of block ``(layer, part)`` of a transfer,
    encoded by codec ``codec`` (wire id); ``crc`` is the CRC-32 of ``payload``.
    With ``blocks`` = k > 1 the chunk runs on through the next k − 1 blocks of the
    layout: rows ``[row_start, end)`` of the first, the middle ones whole, rows
    ``[0, row_end)`` of the last, each encoded alone and concatenated (a small
    model is one frame instead of one per block). ``blocks`` is left off the wire
    when 1, so such frames are what a peer without spans knows.
    See docs/protocol.md §5 and protocol.chunking."""

    TYPE: ClassVar[str] = "chunk"
    transfer: str
    seq: int
    total: int
    layer: int
    part: str
    row_start: int
    row_end: int
    codec: int = 0
    crc: int
    blocks: int = 1
    payload: bytes | memoryview

    SPARSE: ClassVar[frozenset[str]] = frozenset({"blocks"})
    SCHEMA: ClassVar[dict[str, Check]] = {
        "transfer": ck.str_of(128, empty=False),
        "seq": ck.int_in(0, (1 << 24) - 1),
        "total": ck.int_in(1, 1 << 24),
        "layer": ck.int_in(0, 65535),
        "part": ck.str_of(64, empty=False),
        "row_start": ck.int_in(0, U32 - 1),
        "row_end": ck.int_in(1, U32),
        "codec": ck.int_in(0, 255),
        "crc": ck.int_in(0, U32),
        "blocks": ck.int_in(1, MAX_CHUNK_BLOCKS),
        "payload": ck.binary,
    }

    def _cross(self) -> None:
        if self.seq >= self.total:
            raise ck.bad("chunk.seq", f"< total ({self.total})", self.seq)
        if self.blocks == 1 and self.row_end <= self.row_start:
            raise ck.bad("chunk.row_end", f"> row_start ({self.row_start})", self.row_end)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Ack(Message):
    """Server -> client: a result was applied (or why not). ``reason`` is a short
    machine-readable word, one of coordinator.core.validation.Reject's (docs/protocol.md
    §3.6 lists them)."""

    TYPE: ClassVar[str] = "ack"
    task_id: str
    accepted: bool
    reason: str = ""

    SCHEMA: ClassVar[dict[str, Check]] = {
        "task_id": ck.str_of(128, empty=False),
        "accepted": ck.boolean,
        "reason": ck.str_of(64),
    }


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Prefetch(Message):
    """Client -> server, while it computes ``task_id``: send my next task now, so
    its model downloads while this one computes and uploads. Only to a server whose
    ``welcome.prefetch`` is true; a server that cannot give one yet ignores it."""

    TYPE: ClassVar[str] = "prefetch"
    task_id: str

    SCHEMA: ClassVar[dict[str, Check]] = {"task_id": ck.str_of(128, empty=False)}


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Decline(Message):
    """Client -> server: I will not compute ``task_id`` (``reason``: a word such as
    ``compute`` or ``memory``, optionally ``": "`` and detail). The lease ends at once
    instead of at its deadline, so the task goes to another client. Only to a server
    whose ``welcome.decline`` is true (§3.13)."""

    TYPE: ClassVar[str] = "decline"
    task_id: str
    reason: str = ""

    SCHEMA: ClassVar[dict[str, Check]] = {
        "task_id": ck.str_of(128, empty=False),
        "reason": ck.str_of(256),
    }


#: The reason words of a ``decline`` that docs/protocol.md §3.13 lists; ``diverged``
#: is the one a server acts on (its task's lr was too high for the model).
DECLINE_REASONS = frozenset(
    {"diverged", "compute", "memory", "dataset", "optimizer", "codec", "kind", "model"}
)
DIVERGED = "diverged"


def decline_word(reason: str) -> str:
    """A decline reason's word: the text before any ``": "`` detail (§3.13)."""
    return reason.split(":", 1)[0]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Heartbeat(Message):
    """Either side: liveness. ``time`` is the sender's clock; ``echo`` returns the
    peer's last ``time`` so the peer measures round-trip time on its own clock;
    ``held``: seconds between receiving that ``time`` and sending this echo, which
    the peer subtracts (docs/protocol.md §3.7)."""

    TYPE: ClassVar[str] = "heartbeat"
    seq: int
    time: float = 0.0
    echo: float | None = None
    held: float | None = None

    SPARSE: ClassVar[frozenset[str]] = frozenset({"held"})
    SCHEMA: ClassVar[dict[str, Check]] = {
        "seq": ck.int_in(0, I64),
        "time": ck.float_in(-1e15, 1e15),
        "echo": ck.optional(ck.float_in(-1e15, 1e15)),
        "held": ck.optional(ck.float_in(0.0, 1e15)),
    }


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Error(Message):
    """Either side: what went wrong (codes in protocol.errors.ErrorCode; a code this
    version does not know is kept as an int)."""

    TYPE: ClassVar[str] = "error"
    code: int
    message: str = ""

    SCHEMA: ClassVar[dict[str, Check]] = {
        "code": ck.int_in(0, 65535),
        "message": ck.str_of(1024),
    }

    @classmethod
    def from_exception(cls, exc: ProtocolError) -> Error:
        return cls(code=int(exc.code), message=exc.message[:1024])


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Bye(Message):
    """Either side: orderly goodbye before a close with code 1000. From the server,
    ``reason`` = ``BYE_FINISHED`` means the job is over (do not reconnect) and
    ``detail`` says why (``max_versions``...); ``detail`` is left off when empty."""

    TYPE: ClassVar[str] = "bye"
    reason: str = ""
    detail: str = ""

    SPARSE: ClassVar[frozenset[str]] = frozenset({"detail"})
    SCHEMA: ClassVar[dict[str, Check]] = {"reason": ck.str_of(256), "detail": ck.str_of(256)}

    @property
    def finished(self) -> bool:
        """The job is over: the client exits instead of reconnecting."""
        return self.reason == BYE_FINISHED


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Fetch(Message):
    """Client -> server: send me shard ``data`` (a sha256 named by a task) from byte
    ``offset`` on. Only to a server whose ``welcome.data`` is true (§13)."""

    TYPE: ClassVar[str] = "fetch"
    data: str
    offset: int = 0

    SCHEMA: ClassVar[dict[str, Check]] = {
        "data": ck.sha256,
        "offset": ck.int_in(0, U32),
    }


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Data(Message):
    """Server -> client: bytes ``[offset, offset + len(payload))`` of shard ``data``,
    whose whole blob is ``size`` bytes (§13). Sent in offset order, paced like chunks."""

    TYPE: ClassVar[str] = "data"
    data: str
    offset: int
    size: int
    payload: bytes | memoryview

    SCHEMA: ClassVar[dict[str, Check]] = {
        "data": ck.sha256,
        "offset": ck.int_in(0, U32),
        "size": ck.int_in(1, U32),
        "payload": ck.binary,
    }

    def _cross(self) -> None:
        if self.offset + len(self.payload) > self.size:
            raise ck.bad("data.payload", f"to end by size ({self.size})", self.offset)


MESSAGE_TYPES: dict[str, type[Message]] = finish(
    Hello, Welcome, Task, Result, Chunk, Ack, Prefetch, Heartbeat, Error, Bye, Fetch, Data, Decline
)


# -- framing ----------------------------------------------------------------------------


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return pack_ndarray(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} in a message")


_PAYLOAD_KEY = msgpack.packb("payload")


def _bin_header(n: int) -> bytes:
    if n < 1 << 8:
        return b"\xc4" + n.to_bytes(1, "big")
    if n < 1 << 16:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


def _encode_chunk(msg: Chunk) -> bytes:
    """Same bytes as the generic path, but the payload is copied once, by join,
    instead of through msgpack's growing buffer (2-3x faster for large chunks)."""
    # The map to_wire gives, payload left out, fields in order (no dump functions).
    wire = {
        "type": "chunk",
        "transfer": msg.transfer,
        "seq": msg.seq,
        "total": msg.total,
        "layer": msg.layer,
        "part": msg.part,
        "row_start": msg.row_start,
        "row_end": msg.row_end,
        "codec": msg.codec,
        "crc": msg.crc,
    }
    if msg.blocks != 1:
        wire["blocks"] = msg.blocks
    payload = msg.payload
    head = bytearray(msgpack.packb(wire, use_bin_type=True))
    head[0] += 1  # a fixmap of 10 (11 with blocks) entries: the payload makes one more
    return b"".join((head, _PAYLOAD_KEY, _bin_header(len(payload)), payload))


def encode(msg: Message) -> bytes:
    """One message -> one frame (a msgpack map). Floats are always float64."""
    if type(msg) is Chunk:
        return _encode_chunk(msg)
    return msgpack.packb(msg.to_wire(), use_bin_type=True, default=_default)


def _unpack(frame: bytes | bytearray | memoryview, n: int) -> Any:
    lim = max(n, 1)
    try:
        return msgpack.unpackb(
            frame,
            raw=False,
            use_list=True,
            strict_map_key=True,
            ext_hook=ext_hook,
            max_str_len=lim,
            max_bin_len=lim,
            max_array_len=lim,
            max_map_len=lim,
            max_ext_len=lim,
        )
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises a zoo of types; all mean "not msgpack"
        raise ProtocolError(
            ErrorCode.MALFORMED, f"frame is not one msgpack value ({type(exc).__name__})"
        ) from None


def decode(frame: bytes | bytearray | memoryview, *, max_bytes: int | None = None) -> Message:
    """One frame -> a validated message; anything wrong raises ProtocolError only.

    Every msgpack length limit is set to the frame size, so a hostile header can
    not make the decoder allocate more than a small multiple of the frame. A large
    chunk's payload is a zero-copy view into ``frame``: keep the frame unchanged
    until the chunk is consumed.
    """
    n = len(frame)
    if max_bytes is not None and n > max_bytes:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"frame of {n} bytes exceeds {max_bytes}")
    obj = read_flat_map(frame) if n >= FLAT_MAP_MIN_BYTES else None
    if obj is None:
        obj = _unpack(frame, n)
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.MALFORMED, f"frame is a {type(obj).__name__}, not a map")
    kind = obj.get("type")
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"type: unknown message type {ck.show(kind)}")
    try:
        return cls.from_wire(obj)
    except ProtocolError:
        raise
    except (ValueError, TypeError) as exc:  # e.g. LinkLimits rejecting a combination
        raise ProtocolError(ErrorCode.BAD_FIELD, f"{kind}: {exc}") from None
