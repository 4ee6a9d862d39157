"""Link limits, named profiles, a sans-IO send pacer and a receive-side meter.

Theory of operation (docs/protocol.md §8). A link has a byte rate, a message
rate, a maximum frame size and a burst (seconds of rate that may be spent at
once). Both rates are token buckets holding at most ``burst`` seconds of tokens.
A frame of ``n`` bytes may go when the byte bucket holds ``min(n, capacity)``
tokens and the message bucket one token; sending takes ``n`` tokens, so a frame
larger than the bucket leaves a debt that must be repaid before the next frame.
Hence over ANY window of length T the sender puts out at most
``bytes_per_s·T + max(burst·bytes_per_s, max_message_bytes)`` bytes and
``messages_per_s·T + max(1, burst·messages_per_s)`` messages.

Nothing here reads a clock or sleeps: every call takes ``now`` (seconds, any
monotonic origin), so the websocket driver and the simulator drive the same code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from protocol.errors import ErrorCode, ProtocolError
from protocol.states import advance_clock

KIB = 1024
MIB = 1024 * 1024

#: Smallest preferred chunk frame (``LinkLimits.frame_bytes``): below it the
#: per-frame envelope starts to dominate.
MIN_FRAME_BYTES = 4 * KIB


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkLimits:
    """Per-direction limits of one link; ``math.inf`` rates mean no rate limit."""

    bytes_per_s: float
    messages_per_s: float
    max_message_bytes: int
    burst: float = 1.0

    def __post_init__(self) -> None:
        for name in ("bytes_per_s", "messages_per_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
                raise ValueError(f"link limits: {name} must be > 0 (inf allowed), got {v!r}")
            object.__setattr__(self, name, float(v))
        m = self.max_message_bytes
        if isinstance(m, bool) or not isinstance(m, int) or m < 1024:
            raise ValueError(f"link limits: max_message_bytes must be an int >= 1024, got {m!r}")
        b = self.burst
        if isinstance(b, bool) or not isinstance(b, int | float) or not 0 < b < math.inf:
            raise ValueError(f"link limits: burst must be finite seconds > 0, got {b!r}")
        object.__setattr__(self, "burst", float(b))

    @property
    def burst_bytes(self) -> float:
        """Byte bucket capacity; a frame above it goes only from a full bucket."""
        return self.bytes_per_s * self.burst

    @property
    def burst_messages(self) -> float:
        return max(1.0, self.messages_per_s * self.burst)

    @property
    def frame_bytes(self) -> int:
        """Preferred chunk frame size: one burst of the link, within the frame limit.

        Such a frame never leaves the pacer in debt and holds its link at most
        ``burst`` seconds, so heartbeats and acks interleave and a peer's "no
        message for N s" check cannot fire in the middle of one frame (a 16 MiB
        frame on a 50 kB/s link would hold it for five minutes).
        """
        if self.bytes_per_s == math.inf:
            return self.max_message_bytes
        return min(self.max_message_bytes, max(MIN_FRAME_BYTES, int(self.burst_bytes)))

    def transfer_seconds(self, nbytes: int, messages: int = 1) -> float:
        """Lower bound on the time to push ``nbytes`` in ``messages`` frames at rate."""
        return max(nbytes / self.bytes_per_s, messages / self.messages_per_s)


#: Named profiles (brief, "Limits are first-class"). ``roblox`` is the seed's game
#: engine: 50 kB/s, 30 msg/s, about 4 M float32 per message.
PROFILES: dict[str, LinkLimits] = {
    "roblox": LinkLimits(bytes_per_s=50_000, messages_per_s=30, max_message_bytes=16 * MIB),
    "mobile": LinkLimits(bytes_per_s=250_000, messages_per_s=20, max_message_bytes=1 * MIB),
    "lan": LinkLimits(bytes_per_s=125_000_000, messages_per_s=10_000, max_message_bytes=64 * MIB),
    "unlimited": LinkLimits(
        bytes_per_s=math.inf, messages_per_s=math.inf, max_message_bytes=256 * MIB
    ),
}


def profile(name: str) -> LinkLimits:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"link profile: unknown profile {name!r}; expected one of {tuple(PROFILES)}"
        ) from None


def data_cap(mb_per_hour: float) -> LinkLimits:
    """What a volunteer asks for in ``hello.limits`` to move at most
    ``mb_per_hour`` megabytes (10⁶ bytes) an hour, both directions together:
    half of it each way, no message-rate or frame-size limit of its own (the
    server's apply; ``negotiate`` grants the tighter of both). The coordinator
    sizes tasks and leases by the granted rate, so a capped link gets longer
    tasks and, where the job allows, int8 (docs/coordinator.md, "Codecs per
    link"), not refusals."""
    if isinstance(mb_per_hour, bool) or not isinstance(mb_per_hour, int | float):
        raise ValueError(f"data cap: expected megabytes an hour, got {mb_per_hour!r}")
    if not 0 < mb_per_hour < math.inf:
        raise ValueError(f"data cap: must be finite megabytes an hour > 0, got {mb_per_hour!r}")
    return LinkLimits(
        bytes_per_s=mb_per_hour * 1e6 / 3600.0 / 2,
        messages_per_s=math.inf,
        max_message_bytes=PROFILES["unlimited"].max_message_bytes,
    )


def negotiate(asked: LinkLimits | None, server_max: LinkLimits) -> LinkLimits:
    """Grant the tighter of what the client asked for and what the server allows."""
    if asked is None:
        return server_max
    return LinkLimits(
        bytes_per_s=min(asked.bytes_per_s, server_max.bytes_per_s),
        messages_per_s=min(asked.messages_per_s, server_max.messages_per_s),
        max_message_bytes=min(asked.max_message_bytes, server_max.max_message_bytes),
        burst=min(asked.burst, server_max.burst),
    )


class TokenBucket:
    """Token bucket allowing one debt-making take from a full bucket."""

    __slots__ = ("capacity", "level", "rate", "t")

    def __init__(self, rate: float, capacity: float) -> None:
        self.rate = rate
        self.capacity = capacity
        self.level = capacity
        self.t = -math.inf

    def refill(self, now: float) -> None:
        if now < self.t:
            advance_clock("token bucket", self.t, now)  # raises, naming it
        if self.rate == math.inf:
            self.level = self.capacity
        elif self.t != -math.inf:
            self.level = min(self.capacity, self.level + (now - self.t) * self.rate)
        self.t = now


def _reached(due: float, now: float) -> bool:
    """``now`` is at or past ``due``, allowing float round-off: a driver that
    waited exactly until ``due`` may see a bucket level a few ulps short."""
    return due - now <= 1e-9 * max(1.0, abs(now))


class Pacer:
    """Send-side pacing for one link (see the module docstring for the guarantee).

    Call order: ``next_send_time(n, now)`` says when a frame of ``n`` bytes may go;
    at (or after) that time call ``consume(n, now)``. ``consume`` before the frame
    is due raises ValueError: it is the driver's bug, not the peer's.
    """

    __slots__ = ("_bytes", "_msgs", "limits")

    def __init__(self, limits: LinkLimits) -> None:
        self.limits = limits
        cap = limits.burst_bytes if limits.bytes_per_s < math.inf else math.inf
        self._bytes = TokenBucket(limits.bytes_per_s, cap)
        self._msgs = TokenBucket(limits.messages_per_s, limits.burst_messages)

    def _check(self, nbytes: int) -> None:
        if nbytes < 0 or nbytes > self.limits.max_message_bytes:
            raise ValueError(
                f"pacer: frame of {nbytes} bytes outside 0..{self.limits.max_message_bytes}"
            )

    def next_send_time(self, nbytes: int, now: float) -> float:
        """Earliest time >= ``now`` at which a frame of ``nbytes`` may be sent."""
        if nbytes < 0 or nbytes > self.limits.max_message_bytes:
            self._check(nbytes)
        # When each bucket holds what it needs (inline: drivers ask for every frame)
        byts, msgs = self._bytes, self._msgs
        byts.refill(now)
        msgs.refill(now)
        need = float(nbytes) if nbytes < byts.capacity else byts.capacity
        t = now
        if need > byts.level:
            t = now + (need - byts.level) / byts.rate
        if msgs.level < 1.0:
            t = max(t, now + (1.0 - msgs.level) / msgs.rate)
        return t

    def consume(self, nbytes: int, now: float) -> None:
        """Record that a frame of ``nbytes`` went out at ``now``."""
        due = self.next_send_time(nbytes, now)
        if not _reached(due, now):
            raise ValueError(f"pacer: frame of {nbytes} bytes sent at {now}, not due before {due}")
        self._take(nbytes)

    def try_consume(self, nbytes: int, now: float) -> bool:
        """Consume if the frame is due now; say whether it was (with ``consume``'s
        round-off allowance: a driver woken at ``next_send_time`` must find it due)."""
        if not _reached(self.next_send_time(nbytes, now), now):
            return False
        self._take(nbytes)  # consume() would refill at the same ``now``: a no-op
        return True

    def _take(self, nbytes: int) -> None:
        if self._bytes.rate < math.inf:
            self._bytes.level -= nbytes
        if self._msgs.rate < math.inf:
            self._msgs.level -= 1.0


class RateMeter:
    """Receive-side check that a peer stays within the limits it was granted.

    A sender that follows :class:`Pacer` puts out at most ``rate·T + max(burst
    bytes, max_message_bytes)`` in any window, so a plain token bucket of that
    capacity (no debt) accepts it. Arrivals bunch up on a real network (queues,
    retransmits), so the capacity is ``slack`` times that. ``observe`` returns the
    violation (or None) rather than raising, so a core can turn it into a Close.
    """

    __slots__ = ("_bytes", "_msgs", "limits", "slack")

    def __init__(self, limits: LinkLimits, *, slack: float = 2.0) -> None:
        if not slack >= 1.0:
            raise ValueError(f"rate meter: slack must be >= 1, got {slack!r}")
        self.limits = limits
        self.slack = slack
        cap = max(limits.burst_bytes, float(limits.max_message_bytes)) * slack
        self._bytes = TokenBucket(
            limits.bytes_per_s, cap if limits.bytes_per_s < math.inf else math.inf
        )
        self._msgs = TokenBucket(limits.messages_per_s, limits.burst_messages * slack)

    def observe(self, nbytes: int, now: float) -> ProtocolError | None:
        """Account a received frame; return the violation, if any."""
        if nbytes > self.limits.max_message_bytes:
            return ProtocolError(
                ErrorCode.TOO_LARGE,
                f"frame of {nbytes} bytes exceeds max_message_bytes "
                f"{self.limits.max_message_bytes}",
            )
        self._bytes.refill(now)
        self._msgs.refill(now)
        # Tolerances absorb float round-off of a sender paced to the exact limit.
        msgs, byts = self._msgs, self._bytes
        if msgs.rate < math.inf:
            if msgs.level < 1.0 - 1e-6 * msgs.capacity:
                return ProtocolError(
                    ErrorCode.RATE_LIMITED,
                    f"more than {self.limits.messages_per_s:g} messages/s "
                    f"(burst {msgs.capacity:g})",
                )
            msgs.level -= 1.0
        if byts.rate < math.inf:
            if byts.level < nbytes - 1e-6 * byts.capacity:
                return ProtocolError(
                    ErrorCode.RATE_LIMITED,
                    f"more than {self.limits.bytes_per_s:g} bytes/s "
                    f"(burst {byts.capacity:g} bytes)",
                )
            byts.level -= nbytes
        return None
