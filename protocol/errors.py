"""Protocol errors: what a peer did wrong, as a code plus a message naming the field.

Error tree::

    Exception
    ├── ProtocolError(code, message)   the PEER's fault: bad bytes, bad field, rate
    │                                  exceeded, bad chunk. Never escapes a decoder
    │                                  as anything else; a driver turns it into an
    │                                  ``error`` message and/or a websocket close
    │                                  with ``close_code(code)`` (docs/protocol.md §7).
    ├── ValueError / TypeError         the CALLER's fault (a programming error):
    │                                  building a message with a bad field, a row
    │                                  that cannot fit the frame limit. Raised early,
    │                                  never sent to a peer.
    └── compression.CodecError         (a ValueError) from a codec; the protocol
                                       wraps it as ProtocolError(BAD_CHUNK).

Codes are part of the wire format (``error.code``): never renumber, only add.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """Wire error codes (docs/protocol.md §7). Never renumber."""

    MALFORMED = 1  # not a msgpack map, trailing bytes, nesting too deep
    UNKNOWN_TYPE = 2  # "type" missing or not a known message type
    BAD_FIELD = 3  # a field is missing, of the wrong type or out of range
    UNSUPPORTED_VERSION = 4  # hello.version not served
    TOO_LARGE = 5  # frame above max_message_bytes, array above the element limit
    RATE_LIMITED = 6  # peer exceeded its granted bytes/s or messages/s
    AUTH_FAILED = 7  # token refused
    UNKNOWN_TASK = 8  # task_id / transfer not known or no longer leased
    BAD_CHUNK = 9  # chunk does not fit the transfer (rows, part, codec, payload)
    CHECKSUM = 10  # chunk crc32 mismatch
    DUPLICATE = 11  # same chunk seq twice, or result already applied
    CONFLICT = 12  # chunk overlaps rows already received from another seq
    UNEXPECTED = 13  # valid message at the wrong time (state machine)
    TIMEOUT = 14  # heartbeat or deadline missed
    SHUTTING_DOWN = 15  # server going away
    INTERNAL = 16  # our bug; the message never leaks internals
    SLOW_CONSUMER = 17  # peer does not read: its send queue passed its bound
    REPLACED = 18  # a newer connection resumed this session (its resume token)


#: Websocket close code per error code (RFC 6455 §7.4; 4000-4999 private use).
CLOSE_CODES: dict[ErrorCode, int] = {
    ErrorCode.MALFORMED: 1007,  # invalid frame payload data
    ErrorCode.UNKNOWN_TYPE: 4002,
    ErrorCode.BAD_FIELD: 4003,
    ErrorCode.UNSUPPORTED_VERSION: 4004,
    ErrorCode.TOO_LARGE: 1009,  # message too big
    ErrorCode.RATE_LIMITED: 1008,  # policy violation
    ErrorCode.AUTH_FAILED: 4007,
    ErrorCode.UNKNOWN_TASK: 4008,
    ErrorCode.BAD_CHUNK: 4009,
    ErrorCode.CHECKSUM: 4010,
    ErrorCode.DUPLICATE: 4011,
    ErrorCode.CONFLICT: 4012,
    ErrorCode.UNEXPECTED: 4013,
    ErrorCode.TIMEOUT: 4014,
    ErrorCode.SHUTTING_DOWN: 1001,  # going away
    ErrorCode.INTERNAL: 1011,  # internal error
    ErrorCode.SLOW_CONSUMER: 4017,
    ErrorCode.REPLACED: 4018,
}

#: Close code for an orderly ``bye``.
CLOSE_NORMAL = 1000
#: Close code for a text frame (the protocol is binary only, docs/protocol.md §2).
CLOSE_UNSUPPORTED_DATA = 1003

if set(CLOSE_CODES) != set(ErrorCode):  # every code has a close code
    raise RuntimeError(f"close codes missing for {set(ErrorCode) - set(CLOSE_CODES)}")


class ProtocolError(Exception):
    """The peer sent something invalid; ``message`` names the field and the value."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = ErrorCode(code)
        self.message = message

    @property
    def close_code(self) -> int:
        return CLOSE_CODES[self.code]

    def __reduce__(self) -> tuple[type, tuple[ErrorCode, str]]:
        return (type(self), (self.code, self.message))


def close_code(code: ErrorCode) -> int:
    """The websocket close code to use when closing a peer for ``code``."""
    return CLOSE_CODES[ErrorCode(code)]


#: First client-side close code: a client closes for error ``code`` with 4000 + code.
CLIENT_CLOSE_BASE = 4000


def client_close_code(code: ErrorCode | int) -> int:
    """The close code a *client* sends when it closes the server for ``code``.

    A browser may only close with 1000 or 3000-4999 (WebSocket API, ``close()``),
    so clients use ``4000 + code`` for every error, including those the server
    closes with a 1xxx code (MALFORMED: 4001, TOO_LARGE: 4005, RATE_LIMITED: 4006,
    SHUTTING_DOWN: 4015, INTERNAL: 4016); docs/protocol.md §7.
    """
    return CLIENT_CLOSE_BASE + int(ErrorCode(code))
