"""Field checks of the wire messages: (wire value, where) -> the Python value.

Each check returns the value it accepts, converted (an int, a read-only ndarray,
a ``ModelSpec``), or raises ``ProtocolError(BAD_FIELD)`` naming the field and what
was expected, without ever formatting a hostile value in full (``show``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from nn.spec import ModelSpec
from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import LinkLimits
from protocol.shardfile import is_sha256_hex

U32 = 2**32 - 1
I64 = 2**63 - 1
U64 = 2**64 - 1


def show(v: Any) -> str:
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


def bad(where: str, expected: str, got: Any) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_FIELD, f"{where}: expected {expected}, got {show(got)}")


# -- field checks: (wire value, where) -> python value ---------------------------------

Check = Callable[[Any, str], Any]


def int_in(lo: int, hi: int) -> Check:
    def check(v: Any, where: str) -> int:
        if type(v) is int and lo <= v <= hi:  # the common case, without the unions below
            return v
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or not lo <= v <= hi:
            raise bad(where, f"int in [{lo}, {hi}]", v)
        return int(v)

    return check


def float_in(lo: float, hi: float, *, inf: bool = False) -> Check:
    def check(v: Any, where: str) -> float:
        if type(v) is float and lo <= v <= hi:
            return v
        ok = isinstance(v, int | float | np.floating) and not isinstance(v, bool)
        if ok:
            v = float(v)
            ok = (lo <= v <= hi) or (inf and v == math.inf)
        if not ok:
            raise bad(where, f"finite number in [{lo:g}, {hi:g}]", v)
        return v

    return check


def str_of(maxlen: int, choices: tuple[str, ...] | None = None, *, empty: bool = True) -> Check:
    def check(v: Any, where: str) -> str:
        if not isinstance(v, str) or len(v) > maxlen or (not empty and not v):
            raise bad(where, f"{'' if empty else 'non-empty '}string of <= {maxlen} chars", v)
        if choices is not None and v not in choices:
            raise bad(where, f"one of {list(choices)}", v)
        return v

    return check


def word(maxlen: int) -> Check:
    """A short token: ``a-z 0-9 . -``, at most ``maxlen`` characters, or empty."""
    allowed = frozenset("abcdefghijklmnopqrstuvwxyz0123456789.-")

    def check(v: Any, where: str) -> str:
        if not isinstance(v, str) or len(v) > maxlen or not allowed.issuperset(v):
            raise bad(where, f"string of <= {maxlen} chars of a-z 0-9 . -", v)
        return v

    return check


def boolean(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise bad(where, "bool", v)
    return v


def binary(v: Any, where: str) -> bytes | memoryview:
    if not isinstance(v, bytes | bytearray | memoryview):
        raise bad(where, "bin (bytes)", v)
    return v


def optional(check: Check) -> Check:
    def opt(v: Any, where: str) -> Any:
        return None if v is None else check(v, where)

    return opt


def strs(maxitems: int, maxlen: int) -> Check:
    item = str_of(maxlen, empty=False)

    def check(v: Any, where: str) -> tuple[str, ...]:
        if not isinstance(v, list | tuple) or len(v) > maxitems:
            raise bad(where, f"array of <= {maxitems} strings", v)
        return tuple(item(x, f"{where}[{i}]") for i, x in enumerate(v))

    return check


def scalars(maxitems: int, *, numbers_only: bool = False) -> Check:
    """A small str-keyed map of scalars (optimizer config, metrics)."""
    key = str_of(64, empty=False)
    num = float_in(-1e300, 1e300)
    text = str_of(256)

    def check(v: Any, where: str) -> dict[str, Any]:
        if not isinstance(v, dict) or len(v) > maxitems:
            raise bad(where, f"map of <= {maxitems} entries", v)
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


def indices(v: Any, where: str) -> np.ndarray:
    if not isinstance(v, np.ndarray) or v.ndim != 1 or v.dtype.name not in ("int32", "uint32"):
        raise bad(where, "1-D int32/uint32 ndarray", v)
    if v.dtype.name == "int32" and v.size and v.min() < 0:
        raise bad(where, "non-negative sample indices", int(v.min()))
    return v


def logits(v: Any, where: str) -> np.ndarray:
    if not isinstance(v, np.ndarray) or v.ndim != 2 or v.dtype.name not in ("float32", "float16"):
        raise bad(where, "2-D float32/float16 ndarray", v)
    if not np.isfinite(v).all():
        raise bad(where, "finite values", "non-finite")
    return v


def sha256(v: Any, where: str) -> str:
    if not isinstance(v, str) or not is_sha256_hex(v):
        raise bad(where, "sha256 as 64 lowercase hex digits", v)
    return v


def spec(v: Any, where: str) -> ModelSpec:
    if isinstance(v, ModelSpec):
        return v
    if not isinstance(v, dict):
        raise bad(where, "model spec map", v)
    widths = v.get("widths")
    if not isinstance(widths, list | tuple) or not 2 <= len(widths) <= 64:
        raise bad(f"{where}.widths", "array of 2..64 ints", widths)
    for i, w in enumerate(widths):
        int_in(1, 1 << 20)(w, f"{where}.widths[{i}]")
    try:
        return ModelSpec.from_dict(v)
    except (ValueError, TypeError) as exc:
        raise ProtocolError(ErrorCode.BAD_FIELD, f"{where}: {exc}") from None


_rate = float_in(1e-9, 1e300, inf=True)


def limits(v: Any, where: str) -> LinkLimits:
    if isinstance(v, LinkLimits):
        return v
    if not isinstance(v, dict):
        raise bad(where, "link limits map", v)
    try:
        bps, mps = v["bytes_per_s"], v["messages_per_s"]
        mmb, burst = v["max_message_bytes"], v.get("burst", 1.0)
    except KeyError as exc:
        raise ProtocolError(ErrorCode.BAD_FIELD, f"{where}.{exc.args[0]}: missing") from None
    return LinkLimits(
        bytes_per_s=math.inf if bps is None else _rate(bps, f"{where}.bytes_per_s"),
        messages_per_s=math.inf if mps is None else _rate(mps, f"{where}.messages_per_s"),
        max_message_bytes=int_in(1024, I64)(mmb, f"{where}.max_message_bytes"),
        burst=float_in(1e-6, 1e6)(burst, f"{where}.burst"),
    )


def dump_limits(v: LinkLimits | None) -> dict[str, Any] | None:
    if v is None:
        return None
    return {
        "bytes_per_s": None if v.bytes_per_s == math.inf else v.bytes_per_s,
        "messages_per_s": None if v.messages_per_s == math.inf else v.messages_per_s,
        "max_message_bytes": v.max_message_bytes,
        "burst": v.burst,
    }


DUMP: dict[str, Callable[[Any], Any]] = {
    "limits": dump_limits,
    "spec": lambda s: s.to_dict(),
    "codecs": list,
}
