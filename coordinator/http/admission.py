"""Who may open a connection: a handshake deadline and per-address limits.

These rules are checked before a connection costs the core anything:

- **Handshake deadline.** A TCP connection must complete an HTTP request (for ``/ws``, the
  websocket upgrade) within ``handshake_timeout_s`` of being accepted, or it is closed.
- **Open websocket connections per address** (``max_connections_per_ip``): an upgrade from an
  address that holds that many is answered 429.
- **Open TCP connections per address**: ``max_connections_per_ip + http_spare_per_ip``, closed
  at accept beyond that (file descriptors stay bounded). The spare ones serve plain HTTP only:
  the operator's own ``GET /api/status`` from an address at its websocket bound is answered.
- **Websocket sessions opened per address per second** (``hellos_per_ip_per_s``, a token
  bucket with ``hello_burst``): a client that reconnects in a tight loop is closed with
  ``RATE_LIMITED`` (1008) before its hello reaches the core.

The limits live on one ``Admission`` object per server; the HTTP protocol class uvicorn
instantiates per connection is made for it by ``http_protocol``. Defaults and the operator's
flags: docs/operations.md ("Facing strangers"); why each rule: docs/decisions.md.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coordinator.http.transport import drop_transport_cycle
from protocol.limits import TokenBucket

if TYPE_CHECKING:
    from uvicorn.protocols.http.h11_impl import H11Protocol


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionLimits:
    handshake_timeout_s: float = 10.0
    #: websocket connections one address may hold
    max_connections_per_ip: int = 1024
    #: TCP connections an address may open beyond that, for plain HTTP only
    http_spare_per_ip: int = 8
    hellos_per_ip_per_s: float = 50.0
    hello_burst: float = 500.0

    def __post_init__(self) -> None:
        if not self.handshake_timeout_s > 0:
            raise ValueError(f"handshake_timeout_s: must be > 0, got {self.handshake_timeout_s}")
        if self.max_connections_per_ip < 1:
            raise ValueError(
                f"max_connections_per_ip: must be >= 1, got {self.max_connections_per_ip}"
            )
        if self.http_spare_per_ip < 0:
            raise ValueError(f"http_spare_per_ip: must be >= 0, got {self.http_spare_per_ip}")
        if not self.hellos_per_ip_per_s > 0 or self.hello_burst < 1:
            raise ValueError(
                "hellos_per_ip_per_s must be > 0 and hello_burst >= 1, got "
                f"{self.hellos_per_ip_per_s} and {self.hello_burst}"
            )


class Admission:
    """Per-address counters, touched only on the server's event loop."""

    def __init__(self, limits: AdmissionLimits | None = None) -> None:
        self.limits = limits or AdmissionLimits()
        #: open TCP connections per address (websockets included)
        self.open: dict[str, int] = {}
        #: open websocket connections per address
        self.sockets: dict[str, int] = {}
        self._hellos: dict[str, TokenBucket] = {}
        #: connections refused: over a per-address bound (at accept, or the websocket
        #: upgrade), handshake too slow, sessions too fast
        self.refused_open = 0
        self.timed_out = 0
        self.refused_rate = 0

    def connection_opened(self, ip: str) -> bool:
        """Count a new TCP connection; False: the address is over its bound (close it)."""
        n = self.open.get(ip, 0)
        if n >= self.limits.max_connections_per_ip + self.limits.http_spare_per_ip:
            self.refused_open += 1
            return False
        self.open[ip] = n + 1
        return True

    def connection_closed(self, ip: str) -> None:
        _down(self.open, ip)

    def websocket_opened(self, ip: str) -> bool:
        """Count an upgrade to a websocket; False: the address holds its bound (refuse)."""
        n = self.sockets.get(ip, 0)
        if n >= self.limits.max_connections_per_ip:
            self.refused_open += 1
            return False
        self.sockets[ip] = n + 1
        return True

    def websocket_closed(self, ip: str) -> None:
        _down(self.sockets, ip)

    def session_allowed(self, ip: str, now: float | None = None) -> bool:
        """Take one websocket session from the address's bucket; False: too fast."""
        now = time.monotonic() if now is None else now
        bucket = self._hellos.get(ip)
        if bucket is None:
            if len(self._hellos) > 100_000:  # forget full buckets: they equal a new one
                self._forget(now)
            lim = self.limits
            bucket = self._hellos[ip] = TokenBucket(lim.hellos_per_ip_per_s, lim.hello_burst)
        bucket.refill(now)
        if bucket.level < 1:
            self.refused_rate += 1
            return False
        bucket.level -= 1
        return True

    def _forget(self, now: float) -> None:
        for ip, b in list(self._hellos.items()):
            b.refill(now)
            if b.level >= b.capacity:
                del self._hellos[ip]


def _down(counts: dict[str, int], ip: str) -> None:
    n = counts.get(ip, 0) - 1
    if n > 0:
        counts[ip] = n
    else:
        counts.pop(ip, None)


def http_protocol(admission: Admission) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the handshake deadline and per-address bounds."""
    # Imported here: the CLI reads AdmissionLimits' defaults for its --help before it
    # binds, and uvicorn is part of what it imports after.
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class AdmittingH11Protocol(H11Protocol):
        _ip: str | None = None
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            ip = self.client[0] if self.client else None
            if ip is not None and not admission.connection_opened(ip):
                transport.abort()
                return
            self._ip = ip
            self._deadline = self.loop.call_later(
                admission.limits.handshake_timeout_s, self._handshake_late
            )

        def _handshake_late(self) -> None:
            self._deadline = None
            # Upgraded to a websocket (its protocol took the transport), or a request
            # under way: the deadline is met.
            if self.cycle is not None or self.transport.get_protocol() is not self:
                return
            if not self.transport.is_closing():
                admission.timed_out += 1
                self.transport.abort()

        def handle_websocket_upgrade(self, event: Any) -> None:
            ip = self._ip
            if ip is not None and not admission.websocket_opened(ip):
                self._refuse_upgrade(ip)
                return
            super().handle_websocket_upgrade(event)
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            if ip is None:
                return
            ws = self.transport.get_protocol()
            if ws is self:  # not upgraded after all: this protocol gives the TCP count back
                admission.websocket_closed(ip)
                return
            # The websocket protocol owns the transport now: it gives the address's
            # counts back when that connection ends (this protocol hears no more).
            self._ip = None
            lost = type(ws).connection_lost

            def connection_lost(exc: Exception | None) -> None:
                # Off the instance first: it refers to ``ws``, a reference cycle that
                # would keep every closed connection's buffers until a full collection.
                ws.__dict__.pop("connection_lost", None)
                admission.websocket_closed(ip)
                admission.connection_closed(ip)
                lost(ws, exc)

            ws.connection_lost = connection_lost

        def _refuse_upgrade(self, ip: str) -> None:
            """429 and close: the address holds its websockets. The connection was one
            of its spare ones, which carry plain HTTP only."""
            body = (
                f"too many websocket connections from {ip}: "
                f"{admission.limits.max_connections_per_ip} allowed\n"
            ).encode()
            headers = [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ]
            try:
                for ev in (
                    h11.Response(status_code=429, headers=headers, reason=b"Too Many Requests"),
                    h11.Data(data=body),
                    h11.EndOfMessage(),
                ):
                    self.transport.write(self.conn.send(ev) or b"")
            except h11.LocalProtocolError:  # no response possible in this state: just close
                self.transport.abort()
                return
            self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self._release()
            super().connection_lost(exc)
            drop_transport_cycle(self.transport)

        def _release(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            if self._ip is not None:
                admission.connection_closed(self._ip)
                self._ip = None

    return AdmittingH11Protocol
