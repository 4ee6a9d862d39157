"""Per-client link model: latency, bandwidth, messages/s and maximum frame size.

Theory of operation. A client's connection is two independent one-way
:class:`Channel` s (down: server → client, up: client → server). A channel sends
one frame at a time, like the single TCP stream under a websocket:

    start    = max(now, channel free, next message-rate token)
    free     = start + size / bandwidth
    delivery = max(free + latency sample, previous delivery)

so a frame waits behind the frames before it (queueing), occupies the link for
``size / bandwidth`` and lands ``latency`` later; the last ``max`` keeps frames in
order even when latency is random, as TCP does. The message rate is a token
bucket of ``burst`` tokens refilled at ``messages_per_s``. A frame over
``max_frame_bytes`` is refused with :class:`FrameTooLarge`: the sender should
have chunked it, so this is a bug the fault sweep must surface, never a silent
delay.

A :class:`Link` puts the deliveries on the engine at ``Priority.DELIVERY`` and
remembers the ones still in flight. ``drop()`` (the client vanished) cancels
them all: a frame that has not fully landed when the connection dies is lost,
half-sent or not. A new connection gets a new Link.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from protocol.limits import LinkLimits
from simulations.distributions import Distribution, Fixed
from simulations.engine import Engine, Event, Priority


class FrameTooLarge(ValueError):
    """A frame exceeds the link's maximum message size."""


NO_LATENCY = Fixed(value=0.0)
#: the burst of a link with no message-rate limit (``LinkLimits`` says infinity)
UNLIMITED_BURST = 1 << 30


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkSpec:
    """The limits of one client's link; ``math.inf`` means unlimited."""

    latency: Distribution = NO_LATENCY
    bandwidth_up: float = math.inf  # bytes/s, client -> server
    bandwidth_down: float = math.inf  # bytes/s, server -> client
    messages_per_s: float = math.inf  # per direction
    burst: int = 1  # messages that may go back to back
    max_frame_bytes: float = math.inf

    def __post_init__(self) -> None:
        for name in ("bandwidth_up", "bandwidth_down", "messages_per_s", "max_frame_bytes"):
            v = getattr(self, name)
            if not v > 0:
                raise ValueError(f"link.{name}: must be > 0, got {v!r}")
        if self.burst < 1:
            raise ValueError(f"link.burst: must be >= 1, got {self.burst!r}")

    @classmethod
    def from_limits(cls, limits: LinkLimits, *, latency: Distribution = NO_LATENCY) -> LinkSpec:
        """A protocol link profile as a symmetric link; the burst becomes messages
        (an unlimited message rate has an unlimited burst: any large count does)."""
        burst = limits.burst_messages
        return cls(
            latency=latency,
            bandwidth_up=limits.bytes_per_s,
            bandwidth_down=limits.bytes_per_s,
            messages_per_s=limits.messages_per_s,
            burst=int(burst) if math.isfinite(burst) else UNLIMITED_BURST,
            max_frame_bytes=limits.max_message_bytes,
        )

    def one_way(self, nbytes: int, *, up: bool) -> float:
        """Mean time for one message of ``nbytes`` on an idle channel (for ``plan``)."""
        bw = self.bandwidth_up if up else self.bandwidth_down
        return nbytes / bw + self.latency.mean


class Channel:
    """One direction of a link; pure arithmetic on times, no engine."""

    __slots__ = (
        "_last_delivery",
        "_last_refill",
        "_tokens",
        "bandwidth",
        "burst",
        "bytes_sent",
        "frames_sent",
        "free_at",
        "latency",
        "max_frame_bytes",
        "messages_per_s",
        "rng",
        "throttled",
    )

    def __init__(
        self,
        *,
        bandwidth: float,
        messages_per_s: float,
        burst: int,
        max_frame_bytes: float,
        latency: Distribution,
        rng: np.random.Generator,
    ) -> None:
        self.bandwidth = bandwidth
        self.messages_per_s = messages_per_s
        self.burst = burst
        self.max_frame_bytes = max_frame_bytes
        self.latency = latency
        self.rng = rng
        self.free_at = -math.inf
        self._tokens = float(burst)
        self._last_refill = 0.0
        self._last_delivery = -math.inf
        self.bytes_sent = 0
        self.frames_sent = 0
        self.throttled = 0  # frames delayed by the message rate

    def _token_time(self, t: float) -> float:
        """Earliest time >= t at which a token is available; refills up to t."""
        if math.isinf(self.messages_per_s):
            return t
        self._tokens = min(
            float(self.burst), self._tokens + (t - self._last_refill) * self.messages_per_s
        )
        self._last_refill = t
        if self._tokens >= 1.0:
            return t
        wait = (1.0 - self._tokens) / self.messages_per_s
        self._tokens = 1.0
        self._last_refill = t + wait
        self.throttled += 1
        return t + wait

    def send(self, now: float, nbytes: int) -> float:
        """Account one frame sent at ``now``; return its delivery time."""
        if nbytes > self.max_frame_bytes:
            raise FrameTooLarge(
                f"frame of {nbytes} bytes exceeds the link's maximum of "
                f"{int(self.max_frame_bytes)} bytes"
            )
        start = self._token_time(max(now, self.free_at))
        if not math.isinf(self.messages_per_s):
            self._tokens -= 1.0
        self.free_at = start + nbytes / self.bandwidth
        delivery = max(self.free_at + self.latency.sample(self.rng), self._last_delivery)
        self._last_delivery = delivery
        self.bytes_sent += nbytes
        self.frames_sent += 1
        return delivery


class Link:
    """A client's connection on the engine: two channels and the frames in flight."""

    def __init__(self, engine: Engine, spec: LinkSpec, *, name: str) -> None:
        self.engine = engine
        self.spec = spec
        rng = engine.rng(f"link/{name}")
        common = {
            "messages_per_s": spec.messages_per_s,
            "burst": spec.burst,
            "max_frame_bytes": spec.max_frame_bytes,
            "latency": spec.latency,
            "rng": rng,
        }
        self.up = Channel(bandwidth=spec.bandwidth_up, **common)
        self.down = Channel(bandwidth=spec.bandwidth_down, **common)
        self._in_flight: dict[int, Event] = {}
        self._next_id = 0
        self.dropped = False
        self.frames_lost = 0

    def send(
        self, *, up: bool, nbytes: int, on_delivery: Callable[..., Any], args: tuple[Any, ...] = ()
    ) -> float | None:
        """Put a frame on the wire; ``on_delivery(*args)`` runs when it lands.

        Returns the delivery time, or None when the link is already dropped (the
        frame vanishes, as a write to a dead socket does).
        """
        if self.dropped:
            self.frames_lost += 1
            return None
        channel = self.up if up else self.down
        at = channel.send(self.engine.now, nbytes)
        fid = self._next_id
        self._next_id += 1
        self._in_flight[fid] = self.engine.schedule_at(
            at, self._land, fid, on_delivery, args, priority=Priority.DELIVERY
        )
        return at

    def _land(self, fid: int, on_delivery: Callable[..., Any], args: tuple[Any, ...]) -> None:
        del self._in_flight[fid]
        on_delivery(*args)

    def in_flight(self) -> int:
        return len(self._in_flight)

    def drop(self) -> int:
        """The connection died now: every frame not yet landed is lost. Returns their count."""
        self.dropped = True
        lost = len(self._in_flight)
        for ev in self._in_flight.values():
            self.engine.cancel(ev)
        self._in_flight.clear()
        self.frames_lost += lost
        return lost
