"""The in-game client: a game calls ``step(budget_s)`` once per frame, on its own thread.

Why: seed 004 trains inside the game's loop, and its first constraint is the
frame: at 60 fps there are 16.6 ms, and the computation must stop in time to
draw (the seed stops it every ~15 ms). A desktop client beside the game cannot
promise that; a client inside the loop can, because it computes only when the
game hands it time.

Theory of operation. :class:`InGameClient` owns a :class:`ClientSession` (the
same sans-IO session as the desktop client), a :class:`Link` and the task in
hand as a :class:`~client.compute.SlicedTask`. It starts no thread and never
blocks; each ``step(budget_s)``:

1. network: connects (or reconnects, after a backoff) without waiting, reads
   what the socket holds, feeds decoded frames to the session, ticks it
   (heartbeats, paced frames) and writes what the socket takes;
2. compute: runs optimizer steps of the task while they fit in what is left of
   ``budget_s`` (the network part counts against it), by a per-step estimate
   measured here (the median of the last 7 pieces); each piece takes at most
   half of what is left, so a step twice as slow as estimated still ends in
   time; an unfinished task resumes next frame;
3. a finished task goes to the session, and its result's frames go out.

Granularity: one optimizer step (one mini-batch) is the smallest piece: the
compiled training loop does a whole step, every layer, in one call. A step is
~0.5 ms for a [64, 512, 512, 10] MLP at batch 16 on one core here. A step longer
than the whole budget cannot be cut: then the budget of the frames that ran
nothing is banked, and one step runs when the bank covers it, so the average
per frame stays at the budget while the frame it runs in overruns (counted in
``stats.overruns``); a game that sees those should give more time or take a
smaller model. ``gradient`` and ``evaluate`` tasks are one piece each.

Not bounded by the budget: the first call of the numba kernels loads them from the
cache (hundreds of ms: call :meth:`InGameClient.warm_up` at a loading screen; it
also holds numba and BLAS to one thread, the game's), resolving the
coordinator's name (once, at construction), and decoding a task's model as it
arrives (~1 ms for a MB). Encoding a finished result (0.5-2 ms for a MB) waits
for the next frame when this one has no room left for it.

TLS: a ``wss://`` URL speaks TLS through ``ssl.SSLObject`` on memory BIOs (the
sans-IO TLS of the standard library: ciphertext moves through the same
non-blocking socket, nothing blocks), trusting the system's store or, with
``ca``, a coordinator's own certificate (the desktop client's ``--ca``). A
certificate that is not trusted ends the client (``exit_code`` 2): retrying
cannot fix it.

Why long: a complete client without a thread of its own: non-blocking socket,
TLS through ``ssl.SSLObject``, a websocket framer (h11-style, sans-IO) and
compute sliced to a frame budget; a game embeds this one file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import logging
import math
import os
import random
import select
import socket
import ssl
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.uri import parse_uri

from client.compute import ComputeOutput, SlicedTask
from client.datacache import MemoryCache, ShardCache
from client.session import (
    Capabilities,
    ClientSession,
    Close,
    ComputeRequest,
    Finished,
    Phase,
    Send,
)
from compression import codecs
from nn.data import Dataset
from nn.spec import INIT_SCHEME
from protocol import messages as m
from protocol.errors import CLOSE_CODES, ErrorCode, ProtocolError

log = logging.getLogger(__name__)

#: Close codes after which reconnecting cannot help (as the desktop client's).
FATAL_CLOSE_CODES = frozenset(
    CLOSE_CODES[c]
    for c in (ErrorCode.AUTH_FAILED, ErrorCode.UNSUPPORTED_VERSION, ErrorCode.BAD_FIELD)
)
#: Largest frame accepted from a coordinator (the "unlimited" profile + envelope).
MAX_FRAME_BYTES = 256 * 1024 * 1024 + 64 * 1024
#: Bytes one ``poll`` reads at most: a frame's IO stays bounded however fast the link.
MAX_READ_PER_POLL = 8 * 1024 * 1024
#: Seconds a connection may take to open (TCP and websocket handshake).
OPEN_TIMEOUT_S = 10.0
#: Seconds a closing connection waits for the server's close before it is dropped.
CLOSE_TIMEOUT_S = 2.0
#: Share of a core a game is assumed to give when the client advertises its
#: FLOP/s before the coordinator has measured it (a quarter of each frame).
ASSUMED_FRAME_SHARE = 0.25
#: FLOP/s assumed before ``warm_up`` measured this machine
DEFAULT_FLOPS = 1e9
#: Pieces whose median is the per-piece estimate
ESTIMATE_WINDOW = 7
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
        max_size: int = MAX_FRAME_BYTES,
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
            code = self._proto.close_code
            self._close_code = 1005 if code is None else code
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


@dataclass(slots=True)
class InGameStats:
    #: ``step`` calls
    frames: int = 0
    connects: int = 0
    #: optimizer steps (pieces) computed, and the clock seconds they took
    steps: int = 0
    compute_s: float = 0.0
    #: tasks computed and handed to the session
    results: int = 0
    #: frames whose ``step`` ran past its budget (a piece longer than the budget,
    #: an estimate that was short, a result to encode)
    overruns: int = 0
    #: the slowest piece's seconds per step
    longest_step_s: float = 0.0


@dataclass(slots=True)
class _Job:
    req: ComputeRequest
    sliced: SlicedTask
    started: float
    prefetch_at: float | None


class InGameClient:
    """One volunteer inside a game loop; call :meth:`step` once per frame.

    ``clock``: seconds, monotonic (tests pass a fake one); it times both the
    session's events and the compute pieces. ``link``: makes a :class:`Link`
    for ``url`` (default: :class:`WebSocketLink`). ``flops``: this machine's
    training FLOP/s at full speed (default: measured by :meth:`warm_up`, else
    ``DEFAULT_FLOPS``); hello advertises ``ASSUMED_FRAME_SHARE`` of it until the
    coordinator has measured this client's own pace. ``ca``: for a ``wss://``
    URL, trust these CA certificates (a self-signed coordinator's) instead of the
    system's store.
    """

    def __init__(
        self,
        url: str,
        *,
        name: str = "ingame",
        token: str | None = None,
        flops: float | None = None,
        seed: int = 0,
        data: Dataset | None = None,
        prefetch: bool = True,
        fetch_data: bool = True,
        cache: ShardCache | None = None,
        clock: Callable[[], float] = time.monotonic,
        link: Callable[[str], Link] | None = None,
        backoff_base: float = 0.25,
        backoff_cap: float = 30.0,
        stop_grace: float = 3.0,
        ca: str | os.PathLike[str] | None = None,
    ) -> None:
        if flops is not None and not flops > 0:
            raise ValueError(f"flops: must be > 0, got {flops!r}")
        if not backoff_base > 0 or backoff_cap < backoff_base:
            raise ValueError(
                f"backoff: need 0 < base <= cap, got base {backoff_base!r}, cap {backoff_cap!r}"
            )
        self.url = url
        self.token = token
        self.flops = float(flops) if flops is not None else None
        self.data = data
        self.stop_grace = stop_grace
        self.backoff_base, self.backoff_cap = backoff_base, backoff_cap
        tls: ssl.SSLContext | None = None
        if ca is not None:
            if not url.startswith("wss://"):
                raise ValueError(f"ca: {url} is not a wss:// URL")
            try:
                tls = ssl.create_default_context(cafile=os.fspath(ca))
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"ca {ca}: {exc}") from None
        elif url.startswith("wss://"):
            tls = ssl.create_default_context()
        if link is None:
            address = resolve(url)

            def link(u: str) -> Link:
                return WebSocketLink(u, address, tls=tls)

        self._make_link = link
        self._clock = clock
        self._caps = Capabilities(
            flops=(self.flops or DEFAULT_FLOPS) * ASSUMED_FRAME_SHARE,
            cores=1,
            platform="ingame",
            codecs=tuple(n for n in codecs.names() if len(n) <= 32)[:32],
            init_schemes=(INIT_SCHEME,),
            prefetch=prefetch,
            data=fetch_data,
        )
        self.session = ClientSession(
            name[:64], self._caps, seed=seed, cache=cache if cache is not None else MemoryCache()
        )
        self.stats = InGameStats()
        #: why the client ended (None: still running); ``exit_code`` 0 done, 2 refused
        self.finished: str | None = None
        self.exit_code: int | None = None
        self._link: Link | None = None
        self._link_since = 0.0
        self._closing_at: float | None = None
        self._said_hello = False
        self._welcomed = False
        self._attempt = 0
        self._retry_at = -math.inf
        self._jitter = random.Random(seed)
        self._job: _Job | None = None
        #: seconds per piece, by (widths, batch, kind): measured, else from FLOP/s
        self._piece_s: dict[tuple[Any, ...], deque[float]] = {}
        #: a finished task not yet given to the session, and what that took last
        self._result: tuple[_Job, ComputeOutput, float] | None = None
        self._handover_s = 0.0
        self._bank = 0.0
        self._stop_at: float | None = None

    # -- public --------------------------------------------------------------------

    def warm_up(self, budget_s: float = 0.2, *, threads: int | None = 1) -> float:
        """Load the compiled kernels and measure FLOP/s (blocks ~``budget_s`` plus
        the kernels' load): call it on the game's thread at a loading screen.

        ``threads``: numba's count for the calling thread and BLAS's for the
        process (``nn.threads.set_threads``; None leaves both alone). One keeps
        the compute on the game's thread: with more, numba and OpenBLAS pools
        compute beside it, and OpenBLAS workers spin-wait for each other, which on
        a busy machine made a 0.4 ms step take 48 ms here."""
        from client.flops import measure_flops
        from nn.threads import set_threads

        if threads is not None:
            set_threads(threads)
        measured = measure_flops(budget_s=budget_s)
        if self.flops is None:
            self.flops = measured
            if self.session.phase is Phase.NEW:
                self.session.caps = dataclasses.replace(
                    self._caps, flops=measured * ASSUMED_FRAME_SHARE
                )
        return measured

    def step(self, budget_s: float) -> None:
        """One frame's share: network IO without waiting, then compute until
        ``budget_s`` seconds (counted from this call) are spent."""
        if not budget_s >= 0:
            raise ValueError(f"budget_s: must be >= 0, got {budget_s!r}")
        start = self._clock()
        self.stats.frames += 1
        if self.finished is not None:
            self._drain_closing(start)
            return
        self._network(start)
        self._hand_over()
        if self.finished is None:
            self._compute(start + budget_s, budget_s)
            self._maybe_stop()
        if self._link is not None:
            self._link.flush()
        if self._clock() > start + budget_s:
            self.stats.overruns += 1

    def stop(self) -> None:
        """Finish the task in hand if that takes at most ``stop_grace`` seconds of
        frames, else abandon it; then say bye and close. Keep calling ``step``
        until ``finished`` is set."""
        if self._stop_at is None:
            self._stop_at = self._clock() + self.stop_grace
            self.session.wind_down()
            self._maybe_stop()

    def close(self) -> None:
        """Drop the connection now (the game is exiting): no bye, no grace."""
        if self._link is not None:
            self._link.abort()
            self._link = None
        if self.finished is None:
            self.finished, self.exit_code = "closed", 0

    @property
    def computing(self) -> bool:
        """A task is in hand (the next ``step`` will compute)."""
        return self._job is not None

    # -- network -------------------------------------------------------------------

    def _network(self, now: float) -> None:
        link = self._link
        session = self.session
        if link is None:
            if now < self._retry_at:
                return
            self._link = link = self._make_link(self.url)
            self._link_since, self._said_hello, self._welcomed = now, False, False
            self._closing_at = None
        frames = link.poll()
        if link.state is LinkState.OPEN and not self._said_hello:
            self._said_hello = True
            self.stats.connects += 1
            self._do(session.start(now))
        for frame in frames:
            if session.phase not in (Phase.HELLO_SENT, Phase.READY) or self.finished:
                break
            try:
                if isinstance(frame, str):
                    raise ProtocolError(ErrorCode.MALFORMED, "a text frame (binary only)")
                msg = m.decode(frame)
            except ProtocolError as exc:
                log.warning("bad frame from the coordinator: %s", exc)
                self._do(session.refuse(exc, now))
                break
            if isinstance(msg, m.Welcome):
                self._welcomed = True
            self._do(session.receive(msg, now))
        if self.finished is not None:
            return
        if link.state is LinkState.CONNECTING and now - self._link_since > OPEN_TIMEOUT_S:
            log.info("connection to %s: no handshake in %.0f s", self.url, OPEN_TIMEOUT_S)
            link.abort()
        if link.state is LinkState.CLOSING:  # our close (a refused frame): wait a while
            self._closing_at = now if self._closing_at is None else self._closing_at
            if now - self._closing_at > CLOSE_TIMEOUT_S:
                link.abort()
        if link.state is LinkState.CLOSED:
            self._lost(now, link)
            return
        wake = session.next_wakeup()
        if wake is not None and now >= wake:
            self._do(session.tick(now))
        job = self._job
        if job is not None and job.prefetch_at is not None and now >= job.prefetch_at:
            job.prefetch_at = None
            self._do(session.prefetch(now, job.req.request_id))

    def _lost(self, now: float, link: Link) -> None:
        self._link = None
        if self.session.phase in (Phase.HELLO_SENT, Phase.READY):
            self.session.connection_lost(now)
        code = link.close_code
        if code == TLS_UNTRUSTED:
            self.finished, self.exit_code = "refused: TLS certificate not trusted", 2
            self._job = self._result = None
            return
        if code in FATAL_CLOSE_CODES:
            log.error("coordinator refused this client: close %s", code)
            self.finished, self.exit_code = f"refused: close {code}", 2
            self._job = self._result = None
            return
        if self._stop_at is not None:
            self.finished, self.exit_code = "stopped", 0
            return
        self._attempt = 1 if self._welcomed else self._attempt + 1
        cap = min(self.backoff_cap, self.backoff_base * 2**self._attempt)
        self._retry_at = now + self._jitter.uniform(0, cap)

    def _drain_closing(self, now: float) -> None:
        """After the end: let the closing handshake finish, or drop it in time."""
        link = self._link
        if link is None:
            return
        link.poll()
        if link.state is not LinkState.CLOSED and now - self._link_since > CLOSE_TIMEOUT_S:
            link.abort()
        if link.state is LinkState.CLOSED:
            self._link = None

    def _end(self, reason: str, code: int, close_reason: str) -> None:
        self.finished, self.exit_code = reason, 0
        self._job = self._result = None
        link = self._link
        if link is not None:
            link.close(code, close_reason)
            self._link_since = self._clock()

    def _maybe_stop(self) -> None:
        if self._stop_at is None or self.finished is not None:
            return
        session = self.session
        idle = session.computing is None and session.pending is None
        if not idle and self._clock() < self._stop_at:
            return
        if not idle:
            log.info("stopping: task abandoned")
        session.computing = None
        link = self._link
        if link is not None and link.state is LinkState.OPEN:
            link.send(m.encode(m.Bye(reason="client stopping")))
        self._end("stopped", 1000, "bye")

    def _do(self, actions: list[Any]) -> None:
        for a in actions:
            match a:
                case Send():
                    if self._link is not None:
                        self._link.send(self._with_token(a))
                case ComputeRequest():
                    self._start(a)
                case Finished():
                    log.info("job finished: %s", a.reason)
                    self._end(a.reason, 1000, "job finished")
                case Close():
                    if self._link is not None:
                        self._link.close(a.code, a.reason)

    def _with_token(self, send: Send) -> bytes:
        if self.token is not None and isinstance(send.message, m.Hello):
            return m.encode(dataclasses.replace(send.message, token=self.token))
        return send.frame

    # -- compute -------------------------------------------------------------------

    def _start(self, req: ComputeRequest) -> None:
        now = self._clock()
        data = req.data if req.task.data is not None else self.data
        try:
            sliced = SlicedTask(req.task, req.params, data)
        except (ValueError, MemoryError) as exc:
            self._job = None
            self._failed(req, exc)
            return
        delay = self.session.prefetch_delay()
        self._job = _Job(req, sliced, now, None if delay is None else now + delay)

    def _failed(self, req: ComputeRequest, exc: BaseException) -> None:
        log.error("task %s failed: %s", req.task.task_id, exc)
        word = "memory" if isinstance(exc, MemoryError) else "compute"
        reason = f"{word}: {type(exc).__name__}: {exc}"
        self._do(self.session.compute_failed(req.request_id, reason, self._clock()))

    def _estimate(self, sliced: SlicedTask) -> tuple[tuple[Any, ...], float]:
        """Seconds per piece: the median of the last few measured (one preemption or
        page fault moves it neither way), else the task's FLOPs at ``flops``."""
        t = sliced.task
        key = (t.spec.widths, t.batch, t.kind, 0 if t.kind in ("train", "distill") else t.steps)
        seen = self._piece_s.get(key)
        if not seen:
            return key, sliced.step_flops / (self.flops or DEFAULT_FLOPS)
        return key, statistics.median(seen)

    def _compute(self, deadline: float, budget_s: float) -> None:
        job = self._job
        if job is None:
            return
        if self.session.computing != job.req.request_id:
            self._job = None  # superseded by a new task, or abandoned
            return
        sliced = job.sliced
        ran = False
        while not sliced.finished:
            key, est = self._estimate(sliced)
            left = deadline - self._clock()
            if left >= est > 0:
                # Half of what is left by the estimate: a piece twice as slow as
                # estimated still ends in time, and the clock is read again.
                n = max(1, int(0.5 * left / est))
            elif ran or est <= budget_s:
                break  # the next piece fits a frame: next frame
            elif self._bank + max(left, 0.0) < est:
                # A piece longer than the whole budget: bank this frame's budget
                # and run one piece once the bank covers it.
                self._bank += budget_s
                break
            else:
                n = 1
            self._bank = 0.0
            t0 = self._clock()
            try:
                done = sliced.run(n)
            except (ValueError, MemoryError) as exc:
                self._job = None
                self._failed(job.req, exc)
                return
            spent = self._clock() - t0
            per = spent / max(done, 1)
            self._piece_s.setdefault(key, deque(maxlen=ESTIMATE_WINDOW)).append(per)
            self.stats.steps += done
            self.stats.compute_s += spent
            self.stats.longest_step_s = max(self.stats.longest_step_s, per)
            ran = True
        if sliced.finished:
            self._job = None
            self._result = (job, sliced.output(), self._clock())
            if deadline - self._clock() >= self._handover_s:
                self._hand_over()

    def _hand_over(self) -> None:
        """Give a finished task to the session (encoding its result: a few ms for
        a MB-sized update, so when this frame has no room left it waits for the
        start of the next)."""
        if self._result is None:
            return
        job, out, finished = self._result
        self._result = None
        t0 = self._clock()
        self.stats.results += 1
        self._do(
            self.session.compute_done(
                job.req.request_id,
                out.update,
                t0,
                loss=out.loss,
                samples=out.samples,
                steps=out.steps,
                compute_seconds=finished - job.started,
                metrics=out.metrics,
                boundary=out.boundary,
            )
        )
        self._handover_s = self._clock() - t0
