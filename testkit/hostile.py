"""Frames a hostile or broken peer sends: the generator behind the fuzzers.

Every frame is built from a seeded ``random.Random``, so a failure replays from
its seed. The mix (``KINDS``) covers what a decoder and a state machine must
survive: valid-looking maps with a field of the wrong type, truncated frames,
unknown or malformed ext types, msgpack headers that declare huge lengths, deep
nesting, trailing bytes, random bytes, and valid messages at the wrong time or
naming another session's tasks and transfers (out of order, cross-session).
Used by ``benchmarks/fuzz.py`` (a million frames) and a hypothesis test.
"""

from __future__ import annotations

import random
import struct
from typing import Any

import msgpack

from protocol.ndarray import NDARRAY_EXT

KINDS = (
    "wrong_type",
    "truncated",
    "bad_ext",
    "huge_length",
    "deep",
    "trailing",
    "random_bytes",
    "wrong_time",
    "cross_session",
)

_TYPES = (
    "hello", "welcome", "task", "result", "chunk", "ack", "prefetch", "heartbeat",
    "error", "bye", "fetch", "data", "decline",
)  # fmt: skip

_ODD = (None, True, -1, 2**63, 1e308, float("inf"), "", "x" * 300, b"\x00" * 9, [], {}, [1, [2]])


def _plausible(rng: random.Random, task_ids: list[str]) -> dict[str, Any]:
    """A map that looks like a real client message (some of them valid)."""
    tid = rng.choice(task_ids) if task_ids and rng.random() < 0.8 else str(rng.randrange(1, 50))
    kind = rng.choice(("result", "chunk", "heartbeat", "prefetch", "fetch", "bye", "decline"))
    if kind == "result":
        return {"type": "result", "task_id": tid, "model_version": rng.randrange(0, 5),
                "num_chunks": rng.randrange(0, 4), "samples": 16, "steps": 1}  # fmt: skip
    if kind == "chunk":
        rows = rng.randrange(1, 8)
        payload = bytes(rng.getrandbits(8) for _ in range(rng.choice((0, 4, 4 * rows, 33))))
        return {"type": "chunk", "transfer": tid, "seq": rng.randrange(0, 3),
                "total": rng.randrange(1, 4), "layer": rng.randrange(0, 3),
                "part": rng.choice(("W", "b", "Q")), "row_start": 0, "row_end": rows,
                "codec": rng.choice((0, 0, 2, 99)), "crc": rng.getrandbits(32),
                "payload": payload}  # fmt: skip
    if kind == "heartbeat":
        return {"type": "heartbeat", "seq": rng.randrange(0, 100), "time": rng.random()}
    if kind == "fetch":
        return {"type": "fetch", "data": f"{rng.getrandbits(256):064x}",
                "offset": rng.randrange(0, 10**6)}  # fmt: skip
    if kind == "bye":
        return {"type": "bye", "reason": "fuzz"}
    if kind == "decline":
        return {"type": "decline", "task_id": tid, "reason": "fuzz"}
    return {"type": "prefetch", "task_id": tid}


def frame(rng: random.Random, task_ids: list[str] | None = None) -> tuple[str, bytes]:
    """``(kind, frame bytes)``: one hostile frame. ``task_ids`` are ids the caller
    saw leased (to this or another session), for cross-session and out-of-order."""
    ids = task_ids or []
    kind = rng.choice(KINDS)
    if kind == "wrong_type":
        msg = _plausible(rng, ids)
        key = rng.choice(list(msg))
        msg[key] = rng.choice(_ODD)
        if rng.random() < 0.2:
            msg["type"] = rng.choice((*_TYPES, "nope", 7))
        return kind, msgpack.packb(msg, use_bin_type=True)
    if kind == "truncated":
        full = msgpack.packb(_plausible(rng, ids), use_bin_type=True)
        return kind, full[: rng.randrange(0, max(1, len(full)))]
    if kind == "bad_ext":
        code = rng.choice((NDARRAY_EXT, NDARRAY_EXT, 2, 42, 127, -1))
        if code == NDARRAY_EXT:
            dtype, ndim = rng.choice((0, 5, 6, 200)), rng.choice((1, 2, 5, 255))
            shape = [rng.choice((1, 3, 2**31)) for _ in range(min(ndim, 5))]
            data = struct.pack(f"<BBH{len(shape)}I", dtype, ndim, rng.choice((0, 1)), *shape)
            data += bytes(rng.randrange(0, 16))
        else:
            data = bytes(rng.randrange(0, 16))
        ext = msgpack.ExtType(code, data) if code >= 0 else msgpack.ExtType(3, data)
        msg = {"type": "task", "task_id": "1", "indices": ext}
        return kind, msgpack.packb(msg, use_bin_type=True)
    if kind == "huge_length":
        head = rng.choice(
            (b"\xc6", b"\xdb", b"\xdd", b"\xdf", b"\xc9\x01")
        )  # bin/str/array/map/ext
        return kind, b"\x81\xa4type" + head + struct.pack(">I", rng.choice((2**31, 2**32 - 1)))
    if kind == "deep":
        depth = rng.randrange(50, 5000)
        return kind, b"\x91" * depth + b"\xc0"
    if kind == "trailing":
        return kind, msgpack.packb(_plausible(rng, ids), use_bin_type=True) + b"\x00"
    if kind == "random_bytes":
        return kind, bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 64)))
    if kind == "wrong_time":
        msg = rng.choice((
            {"type": "hello", "client": "again"},
            {"type": "welcome", "session_id": "s", "limits": {"bytes_per_s": None,
             "messages_per_s": None, "max_message_bytes": 1024}},
            {"type": "ack", "task_id": "1", "accepted": True},
            {"type": "error", "code": 3, "message": "fuzz"},
        ))  # fmt: skip
        return kind, msgpack.packb(msg, use_bin_type=True)
    return kind, msgpack.packb(_plausible(rng, ids), use_bin_type=True)  # cross_session
