"""Protocol messages: typed, validated, one msgpack map per websocket binary frame.

Every message is a frozen dataclass with a wire ``type`` string and a schema
(field name -> check). Constructing a message with a bad field is the caller's
ValueError; decoding a frame with one is the peer's ProtocolError naming the field
(``task.steps: expected int in [1, 1000000000], got 'x'``). Unknown extra keys
are ignored so that a newer peer can add optional fields (docs/protocol.md §9).
Field tables: docs/protocol.md §3.

Why long: one dataclass per wire message with its field validation, the
spec's §3 tables in code; splitting by message would scatter one table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

import msgpack
import numpy as np

from nn.spec import ModelSpec
from protocol.errors import ErrorCode, ProtocolError
from protocol.flatmap import read_flat_map
from protocol.limits import LinkLimits
from protocol.ndarray import ext_hook, pack_ndarray
from protocol.shardfile import is_sha256_hex

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

U32 = 2**32 - 1
I64 = 2**63 - 1
#: Most blocks one chunk may span (``chunk.blocks``): 2 per layer, 65536 layers.
MAX_CHUNK_BLOCKS = 1 << 17
U64 = 2**64 - 1


def _show(v: Any) -> str:
    """A short repr that never formats a huge value in full (a hostile 16 MB str)."""
    if isinstance(v, bytes | bytearray | memoryview):
        return f"<{len(v)} bytes>"
    if isinstance(v, list | tuple | dict):
        return f"<{type(v).__name__} of {len(v)}>"
    if isinstance(v, np.ndarray):
        return f"<ndarray {v.dtype} {list(v.shape)}>"
    if isinstance(v, str) and len(v) > 60:
        v = v[:57] + "..."
    shown = repr(v)
    return shown if len(shown) <= 64 else shown[:61] + "..."


def _bad(where: str, expected: str, got: Any) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_FIELD, f"{where}: expected {expected}, got {_show(got)}")


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


# -- field checks: (wire value, where) -> python value ---------------------------------

Check = Callable[[Any, str], Any]


def _int(lo: int, hi: int) -> Check:
    def check(v: Any, where: str) -> int:
        if type(v) is int and lo <= v <= hi:  # the common case, without the unions below
            return v
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or not lo <= v <= hi:
            raise _bad(where, f"int in [{lo}, {hi}]", v)
        return int(v)

    return check


def _float(lo: float, hi: float, *, inf: bool = False) -> Check:
    def check(v: Any, where: str) -> float:
        if type(v) is float and lo <= v <= hi:
            return v
        ok = isinstance(v, int | float | np.floating) and not isinstance(v, bool)
        if ok:
            v = float(v)
            ok = (lo <= v <= hi) or (inf and v == math.inf)
        if not ok:
            raise _bad(where, f"finite number in [{lo:g}, {hi:g}]", v)
        return v

    return check


def _str(maxlen: int, choices: tuple[str, ...] | None = None, *, empty: bool = True) -> Check:
    def check(v: Any, where: str) -> str:
        if not isinstance(v, str) or len(v) > maxlen or (not empty and not v):
            raise _bad(where, f"{'' if empty else 'non-empty '}string of <= {maxlen} chars", v)
        if choices is not None and v not in choices:
            raise _bad(where, f"one of {list(choices)}", v)
        return v

    return check


def _bool(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise _bad(where, "bool", v)
    return v


def _bytes(v: Any, where: str) -> bytes | memoryview:
    if not isinstance(v, bytes | bytearray | memoryview):
        raise _bad(where, "bin (bytes)", v)
    return v


def _opt(check: Check) -> Check:
    def opt(v: Any, where: str) -> Any:
        return None if v is None else check(v, where)

    return opt


def _strs(maxitems: int, maxlen: int) -> Check:
    item = _str(maxlen, empty=False)

    def check(v: Any, where: str) -> tuple[str, ...]:
        if not isinstance(v, list | tuple) or len(v) > maxitems:
            raise _bad(where, f"array of <= {maxitems} strings", v)
        return tuple(item(x, f"{where}[{i}]") for i, x in enumerate(v))

    return check


def _scalars(maxitems: int, *, numbers_only: bool = False) -> Check:
    """A small str-keyed map of scalars (optimizer config, metrics)."""
    key = _str(64, empty=False)
    num = _float(-1e300, 1e300)
    text = _str(256)

    def check(v: Any, where: str) -> dict[str, Any]:
        if not isinstance(v, dict) or len(v) > maxitems:
            raise _bad(where, f"map of <= {maxitems} entries", v)
        out: dict[str, Any] = {}
        for k, x in v.items():
            key(k, f"{where} key")
            if isinstance(x, bool) and not numbers_only:
                out[k] = x
            elif isinstance(x, str) and not numbers_only:
                out[k] = text(x, f"{where}.{k}")
            else:
                out[k] = num(x, f"{where}.{k}")
        return out

    return check


def _indices(v: Any, where: str) -> np.ndarray:
    if not isinstance(v, np.ndarray) or v.ndim != 1 or v.dtype.name not in ("int32", "uint32"):
        raise _bad(where, "1-D int32/uint32 ndarray", v)
    if v.dtype.name == "int32" and v.size and v.min() < 0:
        raise _bad(where, "non-negative sample indices", int(v.min()))
    return v


def _logits(v: Any, where: str) -> np.ndarray:
    if not isinstance(v, np.ndarray) or v.ndim != 2 or v.dtype.name not in ("float32", "float16"):
        raise _bad(where, "2-D float32/float16 ndarray", v)
    if not np.isfinite(v).all():
        raise _bad(where, "finite values", "non-finite")
    return v


def _sha256(v: Any, where: str) -> str:
    if not isinstance(v, str) or not is_sha256_hex(v):
        raise _bad(where, "sha256 as 64 lowercase hex digits", v)
    return v


def _spec(v: Any, where: str) -> ModelSpec:
    if isinstance(v, ModelSpec):
        return v
    if not isinstance(v, dict):
        raise _bad(where, "model spec map", v)
    widths = v.get("widths")
    if not isinstance(widths, list | tuple) or not 2 <= len(widths) <= 64:
        raise _bad(f"{where}.widths", "array of 2..64 ints", widths)
    for i, w in enumerate(widths):
        _int(1, 1 << 20)(w, f"{where}.widths[{i}]")
    try:
        return ModelSpec.from_dict(v)
    except (ValueError, TypeError) as exc:
        raise ProtocolError(ErrorCode.BAD_FIELD, f"{where}: {exc}") from None


_rate = _float(1e-9, 1e300, inf=True)


def _limits(v: Any, where: str) -> LinkLimits:
    if isinstance(v, LinkLimits):
        return v
    if not isinstance(v, dict):
        raise _bad(where, "link limits map", v)
    try:
        bps, mps = v["bytes_per_s"], v["messages_per_s"]
        mmb, burst = v["max_message_bytes"], v.get("burst", 1.0)
    except KeyError as exc:
        raise ProtocolError(ErrorCode.BAD_FIELD, f"{where}.{exc.args[0]}: missing") from None
    return LinkLimits(
        bytes_per_s=math.inf if bps is None else _rate(bps, f"{where}.bytes_per_s"),
        messages_per_s=math.inf if mps is None else _rate(mps, f"{where}.messages_per_s"),
        max_message_bytes=_int(1024, I64)(mmb, f"{where}.max_message_bytes"),
        burst=_float(1e-6, 1e6)(burst, f"{where}.burst"),
    )


def _dump_limits(v: LinkLimits | None) -> dict[str, Any] | None:
    if v is None:
        return None
    return {
        "bytes_per_s": None if v.bytes_per_s == math.inf else v.bytes_per_s,
        "messages_per_s": None if v.messages_per_s == math.inf else v.messages_per_s,
        "max_message_bytes": v.max_message_bytes,
        "burst": v.burst,
    }


_DUMP: dict[str, Callable[[Any], Any]] = {
    "limits": _dump_limits,
    "spec": lambda s: s.to_dict(),
    "codecs": list,
}


# -- messages ---------------------------------------------------------------------------


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
            if not isinstance(v, np.ndarray) and v == _SPARSE_DEFAULTS[self.TYPE][name]:
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


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Hello(Message):
    """Client -> server, first frame: who I am and what link I ask for.
    ``deltas``: this client applies ``task.delta_base`` downloads. ``seeded_init``:
    it builds version 0 itself from ``task.init_seed`` with NumPy's PCG64 (the
    legacy scheme); ``init_schemes``: the portable init schemes it builds it with
    (docs/protocol.md §3.3, §12.3).
    ``spans``: it takes chunks that span several blocks (``chunk.blocks`` > 1, §5.3).
    ``boundary``: it returns a layer-split task's boundary activations (§3.3.2)."""

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

    SPARSE: ClassVar[frozenset[str]] = frozenset({"data", "init_schemes", "boundary"})
    SCHEMA: ClassVar[dict[str, Check]] = {
        "version": _int(0, 65535),
        "client": _str(64, empty=False),
        "platform": _str(64),
        "cores": _int(1, 4096),
        "memory": _int(0, I64),
        "flops": _float(0.0, 1e18),
        "limits": _opt(_limits),
        "codecs": _strs(32, 32),
        "token": _opt(_str(512)),
        "resume": _opt(_str(128)),
        "deltas": _bool,
        "seeded_init": _bool,
        "spans": _bool,
        "data": _bool,
        "init_schemes": _strs(8, 32),
        "boundary": _bool,
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

    SPARSE: ClassVar[frozenset[str]] = frozenset({"data", "decline", "job"})
    SCHEMA: ClassVar[dict[str, Check]] = {
        "version": _int(0, 65535),
        "session_id": _str(128, empty=False),
        "resume_token": _str(128),
        "limits": _limits,
        "heartbeat_interval": _float(0.001, 3600.0),
        "spans": _bool,
        "prefetch": _bool,
        "data": _bool,
        "decline": _bool,
        "job": _str(128),
    }


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Task(Message):
    """Server -> client: a unit of work. The model is either already held by the
    client (``base_version``) or follows as ``num_chunks`` chunks of transfer
    ``model_transfer`` (shared between tasks so frames can be reused); with
    ``delta_base`` the chunks are ``model_version − delta_base``, to add to the
    client's copy of ``delta_base``. ``error_feedback`` asks the client to carry
    what ``upload_codec`` dropped into its next result. A ``distill`` task trains
    the student toward ``teacher_logits`` (one row per entry of ``indices``) at
    ``temperature``, mixed with the hard labels by ``distill_alpha``. With
    ``init_seed`` (version 0, to a client whose hello listed ``init_scheme`` in
    ``init_schemes``; nil scheme: legacy PCG64, to ``seeded_init``) no model
    follows: the client builds it from the seed and checks its CRC-32 against
    ``init_crc``. A sub-model task (``subnet``) is an ordinary task on a narrower
    ``spec``; ``subnet`` names the job model's hidden neurons it keeps (§3.3.1).
    With ``boundary`` = c (a layer-split job's lower block, §3.3.2) the result
    also carries the activations of hidden layer c, after training, for every
    row the task names (``Result`` layout: the update's blocks, then ``(L, "h")``)."""

    TYPE: ClassVar[str] = "task"
    task_id: str
    kind: str = "train"
    model_version: int
    spec: ModelSpec
    dataset: str
    shard: int = 0
    indices: np.ndarray | None = None
    steps: int = 1
    batch: int = 16
    optimizer: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    deadline: float = 60.0
    base_version: int | None = None
    model_transfer: str | None = None
    num_chunks: int = 0
    upload_codec: str = "fp32"
    error_feedback: bool = False
    delta_base: int | None = None
    teacher_logits: np.ndarray | None = None
    temperature: float = 4.0
    distill_alpha: float = 0.7
    init_seed: int | None = None
    init_crc: int | None = None
    data: str | None = None
    init_scheme: str | None = None
    subnet: np.ndarray | None = None
    boundary: int | None = None

    SPARSE: ClassVar[frozenset[str]] = frozenset({"data", "init_scheme", "subnet", "boundary"})
    SCHEMA: ClassVar[dict[str, Check]] = {
        "task_id": _str(128, empty=False),
        "kind": _str(32, TASK_KINDS),
        "model_version": _int(0, I64),
        "spec": _spec,
        "dataset": _str(128, empty=False),
        "shard": _int(0, U32),
        "indices": _opt(_indices),
        "steps": _int(1, 1_000_000_000),
        "batch": _int(1, 1 << 20),
        "optimizer": _scalars(32),
        "seed": _int(0, U64),
        "deadline": _float(0.001, 1e7),
        "base_version": _opt(_int(0, I64)),
        "model_transfer": _opt(_str(128, empty=False)),
        "num_chunks": _int(0, 1 << 24),
        "upload_codec": _str(32, empty=False),
        "error_feedback": _bool,
        "delta_base": _opt(_int(0, I64)),
        "teacher_logits": _opt(_logits),
        "temperature": _float(1e-3, 1e3),
        "distill_alpha": _float(0.0, 1.0),
        "init_seed": _opt(_int(0, U64)),
        "init_crc": _opt(_int(0, U32)),
        "data": _opt(_sha256),
        "init_scheme": _opt(_str(32, empty=False)),
        "subnet": _opt(_indices),
        "boundary": _opt(_int(1, 65535)),
    }

    def _cross(self) -> None:
        if self.subnet is not None:
            self._cross_subnet(self.subnet)
        if self.boundary is not None:
            hidden = len(self.spec.widths) - 2
            if self.kind != "train" or self.boundary > hidden:
                raise _bad(
                    "task.boundary",
                    f"a hidden layer 1..{hidden} of a train task's spec",
                    self.boundary,
                )
        if self.init_seed is not None:
            if (
                self.init_crc is None
                or self.model_version != 0
                or self.num_chunks
                or self.base_version is not None
                or self.delta_base is not None
            ):
                raise ProtocolError(
                    ErrorCode.BAD_FIELD,
                    "task.init_seed: only for model_version 0, with init_crc, no chunks, "
                    "no base_version and no delta_base",
                )
            self._cross_distill()
            return
        if self.init_crc is not None:
            raise ProtocolError(ErrorCode.BAD_FIELD, "task.init_crc: only with init_seed")
        if self.init_scheme is not None:
            raise ProtocolError(ErrorCode.BAD_FIELD, "task.init_scheme: only with init_seed")
        if self.num_chunks and self.model_transfer is None:
            raise ProtocolError(
                ErrorCode.BAD_FIELD, "task.model_transfer: required when num_chunks > 0"
            )
        if self.model_transfer is not None and not self.num_chunks:
            raise ProtocolError(
                ErrorCode.BAD_FIELD, "task.num_chunks: must be > 0 when model_transfer is set"
            )
        if self.base_version is None and not self.num_chunks:
            raise ProtocolError(
                ErrorCode.BAD_FIELD, "task.num_chunks: need base_version or num_chunks > 0"
            )
        if self.delta_base is not None:
            if not self.num_chunks or self.base_version is not None:
                raise ProtocolError(
                    ErrorCode.BAD_FIELD,
                    "task.delta_base: needs model chunks (num_chunks > 0) and no base_version",
                )
            if self.delta_base >= self.model_version:
                raise _bad(
                    "task.delta_base", f"< model_version ({self.model_version})", self.delta_base
                )
        self._cross_distill()

    def _cross_subnet(self, subnet: np.ndarray) -> None:
        """§3.3.1: the kept neurons split by the spec's hidden widths, increasing
        within each layer; the slice always travels."""
        hidden = self.spec.widths[1:-1]
        if subnet.size != sum(hidden):
            raise _bad("task.subnet", f"{sum(hidden)} indices (spec's hidden widths)", subnet.size)
        for layer in np.split(subnet.astype(np.int64), np.cumsum(hidden[:-1], dtype=np.int64)):
            if layer.size > 1 and not bool(np.all(np.diff(layer) > 0)):
                raise _bad("task.subnet", "increasing indices within each layer", "not")
        if not self.num_chunks or self.base_version is not None or self.delta_base is not None:
            raise ProtocolError(
                ErrorCode.BAD_FIELD,
                "task.subnet: needs its slice as chunks (num_chunks > 0), "
                "no base_version and no delta_base",
            )

    def _cross_distill(self) -> None:
        if self.kind == "distill":
            t = self.teacher_logits
            if t is None or self.indices is None:
                raise ProtocolError(
                    ErrorCode.BAD_FIELD,
                    "task.teacher_logits: a distill task needs them and indices",
                )
            if t.shape != (self.indices.size, self.spec.widths[-1]):
                raise _bad(
                    "task.teacher_logits",
                    f"shape [{self.indices.size}, {self.spec.widths[-1]}] (indices × outputs)",
                    t,
                )


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
        "task_id": _str(128, empty=False),
        "model_version": _int(0, I64),
        "kind": _str(32, TASK_KINDS),
        "num_chunks": _int(0, 1 << 24),
        "loss": _opt(_float(-1e300, 1e300, inf=True)),
        "samples": _int(0, I64),
        "steps": _int(0, I64),
        "compute_seconds": _float(0.0, 1e9),
        "metrics": _scalars(64, numbers_only=True),
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
        "transfer": _str(128, empty=False),
        "seq": _int(0, (1 << 24) - 1),
        "total": _int(1, 1 << 24),
        "layer": _int(0, 65535),
        "part": _str(64, empty=False),
        "row_start": _int(0, U32 - 1),
        "row_end": _int(1, U32),
        "codec": _int(0, 255),
        "crc": _int(0, U32),
        "blocks": _int(1, MAX_CHUNK_BLOCKS),
        "payload": _bytes,
    }

    def _cross(self) -> None:
        if self.seq >= self.total:
            raise _bad("chunk.seq", f"< total ({self.total})", self.seq)
        if self.blocks == 1 and self.row_end <= self.row_start:
            raise _bad("chunk.row_end", f"> row_start ({self.row_start})", self.row_end)


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
        "task_id": _str(128, empty=False),
        "accepted": _bool,
        "reason": _str(64),
    }


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Prefetch(Message):
    """Client -> server, while it computes ``task_id``: send my next task now, so
    its model downloads while this one computes and uploads. Only to a server whose
    ``welcome.prefetch`` is true; a server that cannot give one yet ignores it."""

    TYPE: ClassVar[str] = "prefetch"
    task_id: str

    SCHEMA: ClassVar[dict[str, Check]] = {"task_id": _str(128, empty=False)}


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
        "task_id": _str(128, empty=False),
        "reason": _str(256),
    }


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
        "seq": _int(0, I64),
        "time": _float(-1e15, 1e15),
        "echo": _opt(_float(-1e15, 1e15)),
        "held": _opt(_float(0.0, 1e15)),
    }


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Error(Message):
    """Either side: what went wrong (codes in protocol.errors.ErrorCode; a code this
    version does not know is kept as an int)."""

    TYPE: ClassVar[str] = "error"
    code: int
    message: str = ""

    SCHEMA: ClassVar[dict[str, Check]] = {
        "code": _int(0, 65535),
        "message": _str(1024),
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
    SCHEMA: ClassVar[dict[str, Check]] = {"reason": _str(256), "detail": _str(256)}

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
        "data": _sha256,
        "offset": _int(0, U32),
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
        "data": _sha256,
        "offset": _int(0, U32),
        "size": _int(1, U32),
        "payload": _bytes,
    }

    def _cross(self) -> None:
        if self.offset + len(self.payload) > self.size:
            raise _bad("data.payload", f"to end by size ({self.size})", self.offset)


def _filler(f: Any) -> Callable[[], Any] | None:
    """What makes a left-out field's value (None: the field is required)."""
    if f.default is not MISSING:
        default = f.default
        return lambda: default
    if f.default_factory is not MISSING:
        return f.default_factory  # type: ignore[no-any-return]
    return None


MESSAGE_TYPES: dict[str, type[Message]] = {
    m.TYPE: m
    for m in (
        Hello, Welcome, Task, Result, Chunk, Ack, Prefetch, Heartbeat, Error, Bye, Fetch, Data,
        Decline,
    )
}  # fmt: skip

for _m in MESSAGE_TYPES.values():  # every dataclass field has exactly one check
    if set(_m.SCHEMA) != {f.name for f in fields(_m)}:
        raise RuntimeError(f"{_m.__name__}: SCHEMA does not match the fields")
    _m._PLAN = tuple(
        (f.name, _m.SCHEMA[f.name], f"{_m.TYPE}.{f.name}", _DUMP.get(f.name)) for f in fields(_m)
    )
    _m._FILL = tuple((f.name, f"{_m.TYPE}.{f.name}", _filler(f)) for f in fields(_m))

#: the wire value of each SPARSE key at its default (what the encoder leaves off)
_SPARSE_DEFAULTS: dict[str, dict[str, Any]] = {
    _m.TYPE: {f.name: f.default for f in fields(_m) if f.name in _m.SPARSE}
    for _m in MESSAGE_TYPES.values()
}


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
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"type: unknown message type {_show(kind)}")
    try:
        return cls.from_wire(obj)
    except ProtocolError:
        raise
    except (ValueError, TypeError) as exc:  # e.g. LinkLimits rejecting a combination
        raise ProtocolError(ErrorCode.BAD_FIELD, f"{kind}: {exc}") from None
