"""Read the crowdgrad messages out of one direction of a websocket's TCP stream.

A ``FrameTap`` is fed the bytes a proxy forwards, in order, and returns the small
messages it saw complete (decoded msgpack maps, ``{"type": "ack", ...}``). It
skips the HTTP upgrade (a stream whose answer is not ``101`` is plain HTTP and is
passed over), follows RFC 6455 §5.2 framing (7/16/64-bit lengths, masked client
frames, fragments, control frames) and decodes only messages of at most
``max_message`` bytes: acks, hellos and welcomes are a few hundred bytes; chunks
of a model are counted and skipped, not copied. Frames must be uncompressed
(the desktop client asks for no permessage-deflate). Never raises on odd bytes:
it stops reading the stream (``broken`` says why) and the proxy forwards as before.
"""

from __future__ import annotations

from typing import Any

import msgpack

_OP_CONTINUATION, _OP_CLOSE = 0x0, 0x8


class FrameTap:
    """One direction of one connection (``masked``: the client's side, §5.3)."""

    def __init__(self, *, max_message: int = 64 * 1024) -> None:
        self.max_message = max_message
        self.frames = 0
        self.skipped = 0  # messages too big to decode (model chunks)
        self.broken = ""  # why the tap stopped reading, "" while it reads
        self._buf = bytearray()
        self._in_head = True  # the HTTP request or response before the frames
        self._left = 0  # payload bytes of the current frame still to come
        self._mask = b""
        self._mask_at = 0
        self._keep = False  # whether the current frame's payload is collected
        self._message = bytearray()
        self._message_too_big = False
        self._control = False
        self._fin = False

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        if self.broken:
            return []
        self._buf += data
        out: list[dict[str, Any]] = []
        try:
            self._parse(out)
        except _Stop as stop:
            self.broken = str(stop)
            self._buf.clear()
        return out

    def _parse(self, out: list[dict[str, Any]]) -> None:
        if self._in_head:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > 64 * 1024:
                    raise _Stop("no end of the HTTP head in 64 KiB")
                return
            head = bytes(self._buf[:end]).split(b"\r\n", 1)[0]
            del self._buf[: end + 4]
            if head.startswith(b"HTTP/") and b" 101 " not in head + b" ":
                raise _Stop(f"not a websocket: {head[:40]!r}")
            self._in_head = False
        while True:
            if self._left:
                self._take_payload()
                if self._left:
                    return
                self._end_of_frame(out)
            if not self._header():
                return
            if not self._left:
                self._end_of_frame(out)

    def _header(self) -> bool:
        """Read one frame header from the buffer; False until it is all there."""
        buf = self._buf
        if len(buf) < 2:
            return False
        b0, b1 = buf[0], buf[1]
        if b0 & 0x70:
            raise _Stop("RSV bits set: a compressed or unknown extension")
        opcode, masked, n = b0 & 0x0F, b1 & 0x80, b1 & 0x7F
        at = 2
        if n == 126:
            if len(buf) < 4:
                return False
            n, at = int.from_bytes(buf[2:4], "big"), 4
        elif n == 127:
            if len(buf) < 10:
                return False
            n, at = int.from_bytes(buf[2:10], "big"), 10
        if len(buf) < at + (4 if masked else 0):
            return False
        self._mask = bytes(buf[at : at + 4]) if masked else b""
        at += 4 if masked else 0
        del buf[:at]
        self.frames += 1
        self._fin = bool(b0 & 0x80)
        self._control = opcode >= _OP_CLOSE
        if not self._control and opcode != _OP_CONTINUATION:
            self._message.clear()
            self._message_too_big = False
        self._left, self._mask_at = n, 0
        big = len(self._message) + n > self.max_message
        self._message_too_big |= big and not self._control
        self._keep = not self._control and not self._message_too_big
        if not self._keep and not self._control:
            self._message.clear()
        return True

    def _take_payload(self) -> None:
        n = min(self._left, len(self._buf))
        if self._keep:
            part = bytes(self._buf[:n])
            if self._mask:
                part = _unmask(part, self._mask, self._mask_at)
            self._message += part
        del self._buf[:n]
        self._left -= n
        self._mask_at += n

    def _end_of_frame(self, out: list[dict[str, Any]]) -> None:
        if self._control or not self._fin:
            return
        if self._message_too_big:
            self.skipped += 1
            return
        try:
            obj = msgpack.unpackb(bytes(self._message), raw=False, strict_map_key=False)
        except Exception:  # not msgpack: someone else's protocol, not ours to judge
            obj = None
        self._message.clear()
        if isinstance(obj, dict) and isinstance(obj.get("type"), str):
            out.append(obj)


def _unmask(data: bytes, mask: bytes, offset: int) -> bytes:
    key = (mask[offset % 4 :] + mask[: offset % 4]) * (len(data) // 4 + 1)
    return (int.from_bytes(data, "big") ^ int.from_bytes(key[: len(data)], "big")).to_bytes(
        len(data), "big"
    )


class _Stop(Exception):
    """The stream is not one the tap reads; it stops, the proxy does not."""
