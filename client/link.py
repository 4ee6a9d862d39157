"""A websocket the game's thread polls: nothing in it blocks or starts a thread.

:class:`Link` is what client.ingame needs of a connection (``poll`` makes
progress and returns the frames that arrived; the rest only queue);
:class:`WebSocketLink` is one over a non-blocking TCP socket, with the
``websockets`` library's sans-IO ``ClientProtocol`` doing RFC 6455 and, for
``wss://``, ``ssl.SSLObject`` on memory BIOs doing TLS (the sans-IO TLS of the
standard library: ciphertext moves through the same socket). ``resolve`` is the
one blocking call (DNS), made once so that reconnects need none.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import logging
import select
import socket
import ssl
from typing import Any, Protocol

from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.uri import parse_uri

log = logging.getLogger(__name__)

#: Bytes one ``poll`` reads at most: a frame's IO stays bounded however fast the link.
MAX_READ_PER_POLL = 8 * 1024 * 1024
#: The close code a link reports when the coordinator's TLS certificate is not
#: trusted: 1015, "TLS handshake failure" (RFC 6455 §7.4.1; never on the wire).
TLS_UNTRUSTED = 1015


class LinkState(enum.Enum):
    CONNECTING = "connecting"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class Link(Protocol):
    """A message link the game's thread polls; no method blocks.

    ``poll`` makes progress (connects, reads, writes) and returns the frames
    that arrived: bytes, or str for a text frame (which the session refuses)."""

    @property
    def state(self) -> LinkState: ...

    @property
    def close_code(self) -> int | None: ...

    def poll(self) -> list[bytes | str]: ...

    def send(self, frame: bytes) -> None: ...

    def flush(self) -> None: ...

    def close(self, code: int, reason: str) -> None: ...

    def abort(self) -> None: ...


def resolve(url: str) -> tuple[int, Any]:
    """``(family, sockaddr)`` of a ``ws://`` or ``wss://`` URL's host: the one
    blocking call (DNS), made once so that reconnects need none."""
    uri = parse_uri(url)
    infos = socket.getaddrinfo(uri.host, uri.port, type=socket.SOCK_STREAM)
    if not infos:
        raise ValueError(f"{url}: {uri.host} does not resolve")
    family, _, _, _, addr = infos[0]
    return family, addr


class WebSocketLink:
    """A websocket over a non-blocking TCP socket, driven by the ``websockets``
    library's sans-IO ``ClientProtocol`` (RFC 6455 framing, masking, ping/pong,
    the closing handshake): this class only moves bytes. For ``wss://`` the bytes
    pass through an ``ssl.SSLObject`` on memory BIOs (``tls``: the context; None:
    the system's store)."""

    def __init__(
        self,
        url: str,
        address: tuple[int, Any],
        *,
        max_size: int,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        uri = parse_uri(url)
        self._proto = ClientProtocol(uri, max_size=max_size)
        #: TLS in memory: ciphertext in from the socket, out to it; None for ws://
        self._tls: ssl.SSLObject | None = None
        self._tls_in, self._tls_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls_up = self._tls_closed = False
        #: websocket bytes waiting for the TLS handshake to end
        self._plain = bytearray()
        if uri.secure:
            ctx = tls if tls is not None else ssl.create_default_context()
            self._tls = ctx.wrap_bio(self._tls_in, self._tls_out, server_hostname=uri.host)
        family, addr = address
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setblocking(False)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._state = LinkState.CONNECTING
        self._tcp_up = False
        self._out = bytearray()
        self._eof_pending = False
        self._parts: list[bytes] = []
        self._text = False
        self._close_code: int | None = None
        err = self._sock.connect_ex(addr)
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN, 10035):
            log.info("connect to %s failed: %s", url, errno.errorcode.get(err, err))
            self.abort()
            return
        self._proto.send_request(self._proto.connect())

    @property
    def state(self) -> LinkState:
        return self._state

    @property
    def close_code(self) -> int | None:
        return self._close_code

    def poll(self) -> list[bytes | str]:
        if self._state is LinkState.CLOSED:
            return []
        if not self._tcp_up:
            _, writable, failed = select.select([], [self._sock], [self._sock], 0)
            if not writable and not failed:
                return []
            err = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                log.info("connect failed: %s", errno.errorcode.get(err, err))
                self.abort()
                return []
            self._tcp_up = True
            if self._tls is not None:
                self._handshake()  # the ClientHello, for the _write below
        self._write()
        eof = self._read()
        if self._state is LinkState.CLOSED:  # the TLS handshake failed
            return []
        frames = self._events()
        self._write()
        if eof or self._proto.state is State.CLOSED:
            self._finish()
        return frames

    def send(self, frame: bytes) -> None:
        if self._state is LinkState.OPEN and self._proto.state is State.OPEN:
            self._proto.send_binary(frame)

    def flush(self) -> None:
        if self._state is not LinkState.CLOSED and self._tcp_up:
            self._write()

    def close(self, code: int, reason: str) -> None:
        """Start the closing handshake; ``poll`` finishes it (or ``abort``)."""
        if self._state is LinkState.OPEN and self._proto.state is State.OPEN:
            self._proto.send_close(code, reason)
            self._state = LinkState.CLOSING
            self.flush()
        elif self._state is LinkState.CONNECTING:
            self.abort()

    def abort(self) -> None:
        """Drop the connection now."""
        self._state = LinkState.CLOSED
        if self._close_code is None:
            self._close_code = 1006
        self._sock.close()

    # -- internals -------------------------------------------------------------------

    def _read(self) -> bool:
        """Feed what the socket holds to the protocol (through TLS for wss://);
        True at end of stream."""
        got, eof = 0, False
        while got < MAX_READ_PER_POLL:
            try:
                data = self._sock.recv(256 * 1024)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                log.info("connection lost: %s", exc)
                eof = True
                break
            if not data:
                eof = True
                break
            got += len(data)
            if self._tls is None:
                self._proto.receive_data(data)
            else:
                self._tls_in.write(data)
        if self._tls is not None:
            if eof:
                self._tls_in.write_eof()
            eof = self._tls_read() or eof
        if eof and self._state is not LinkState.CLOSED:
            self._proto.receive_eof()
        return eof

    def _handshake(self) -> bool:
        """Advance the TLS handshake; True once it is done. A failure aborts the
        link (an untrusted certificate with close code ``TLS_UNTRUSTED``)."""
        assert self._tls is not None
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            return False
        except ssl.SSLCertVerificationError as exc:
            log.warning(
                "the coordinator's TLS certificate is not trusted (%s); for a "
                "coordinator with its own certificate pass ca=PEM",
                exc.verify_message,
            )
            self._close_code = TLS_UNTRUSTED
            self.abort()
            return False
        except (ssl.SSLError, OSError) as exc:
            log.info("TLS handshake failed: %s", exc)
            self.abort()
            return False
        self._tls_up = True
        return True

    def _tls_read(self) -> bool:
        """Decrypt what came in and feed it to the protocol; True when TLS ended."""
        assert self._tls is not None
        if not self._tls_up and not self._handshake():
            return self._state is LinkState.CLOSED
        while True:
            try:
                data = self._tls.read(256 * 1024)
            except ssl.SSLWantReadError:
                return False
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return True
            except ssl.SSLError as exc:
                log.info("TLS error: %s", exc)
                return True
            if not data:
                return True
            self._proto.receive_data(data)

    def _events(self) -> list[bytes | str]:
        frames: list[bytes | str] = []
        for event in self._proto.events_received():
            if isinstance(event, Response):
                if self._proto.handshake_exc is not None:
                    log.info("websocket handshake failed: %s", self._proto.handshake_exc)
                    self.abort()
                    return []
                self._state = LinkState.OPEN
            elif isinstance(event, Frame):
                self._frame(event, frames)
        return frames

    def _frame(self, frame: Frame, frames: list[bytes | str]) -> None:
        # RFC 6455 §5.4: a message may come as a first frame and continuations.
        if frame.opcode in (Opcode.TEXT, Opcode.BINARY):
            self._parts, self._text = [bytes(frame.data)], frame.opcode is Opcode.TEXT
        elif frame.opcode is Opcode.CONT:
            self._parts.append(bytes(frame.data))
        elif frame.opcode is Opcode.CLOSE:  # the protocol echoes it; the server ends TCP
            # The frame's own code: the protocol's close_code stays None until TCP ends.
            rcvd = self._proto.close_rcvd
            self._close_code = 1005 if rcvd is None else rcvd.code
            self._state = LinkState.CLOSING
            return
        else:
            return  # ping (answered by the protocol) and pong
        if frame.fin:
            data = b"".join(self._parts)
            self._parts = []
            frames.append(data.decode("utf-8", "replace") if self._text else data)

    def _write(self) -> None:
        tls = self._tls
        for chunk in self._proto.data_to_send():
            if not chunk:  # the protocol's end-of-stream marker
                self._eof_pending = True
            elif tls is None:
                self._out += chunk
            else:
                self._plain += chunk
        if tls is not None and self._tls_up:
            try:
                while self._plain:
                    del self._plain[: tls.write(self._plain)]
                if self._eof_pending and not self._tls_closed:
                    self._tls_closed = True
                    tls.unwrap()  # close_notify; the server's answer is not awaited
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError as exc:
                log.info("TLS error while sending: %s", exc)
        if tls is not None:
            self._out += self._tls_out.read()
        while self._out:
            try:
                n = self._sock.send(self._out)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.info("connection lost while sending: %s", exc)
                self._out.clear()
                self._finish()
                return
            del self._out[:n]
        if self._eof_pending and not self._plain:  # (TLS: not before the handshake)
            self._eof_pending = False
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_WR)

    def _finish(self) -> None:
        if self._close_code is None:
            code = self._proto.close_code
            self._close_code = 1006 if code is None else code
        self._state = LinkState.CLOSED
        self._sock.close()
