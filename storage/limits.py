"""The seed's data-store limits as options, so the game-engine store can be simulated.

The seed persisted models in a key-value store that takes at most 4,000,000
characters a key and about ``60 + 10 × players`` reads or writes a minute. We
store binary chunks, so the key limit becomes ``max_chunk_bytes``; the rate limit
becomes a token bucket that is sans-clock: every call takes ``now`` (seconds on any
monotonic clock the caller owns), so the simulator drives it in virtual time and
the server with ``time.monotonic()``.

One checkpoint costs one write per chunk plus one for its manifest, exactly as the
seed's per-key writes did; ``CheckpointStore.write_cost`` tells what a save costs
before trying it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from protocol.limits import TokenBucket
from storage.errors import WriteBudgetExceeded

#: The seed's key limit (4 M characters), read as bytes of binary chunk.
SEED_MAX_CHUNK_BYTES = 4_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreLimits:
    """``max_chunk_bytes`` bounds one chunk; ``writes_per_minute=None`` means unlimited."""

    max_chunk_bytes: int = SEED_MAX_CHUNK_BYTES
    writes_per_minute: float | None = None

    def __post_init__(self) -> None:
        if self.max_chunk_bytes < 64:
            raise ValueError(f"max_chunk_bytes: must be >= 64, got {self.max_chunk_bytes}")
        if self.writes_per_minute is not None and not self.writes_per_minute > 0:
            raise ValueError(f"writes_per_minute: must be > 0, got {self.writes_per_minute}")

    @classmethod
    def seed_datastore(cls, players: int) -> StoreLimits:
        """The seed's store: 4 M per key, ``60 + 10 × players`` writes a minute."""
        if players < 0:
            raise ValueError(f"players: must be >= 0, got {players}")
        return cls(max_chunk_bytes=SEED_MAX_CHUNK_BYTES, writes_per_minute=60.0 + 10.0 * players)

    def budget(self) -> WriteBudget | None:
        """A fresh budget for these limits, or None when writes are unlimited."""
        if self.writes_per_minute is None:
            return None
        return WriteBudget(writes_per_minute=self.writes_per_minute)


class WriteBudget:
    """Token bucket of writes: one minute's worth of burst, refilled continuously.

    Call order: ``admit(n, now)`` (or ``require``) with non-decreasing ``now``; a
    ``now`` that goes backwards is a caller bug and raises.
    """

    __slots__ = ("_bucket",)

    def __init__(self, *, writes_per_minute: float) -> None:
        if not writes_per_minute > 0:
            raise ValueError(f"writes_per_minute: must be > 0, got {writes_per_minute}")
        # The links' bucket (one home for the arithmetic); a write never goes into debt.
        self._bucket = TokenBucket(float(writes_per_minute) / 60.0, float(writes_per_minute))

    @property
    def capacity(self) -> float:
        return self._bucket.capacity

    @property
    def rate(self) -> float:
        return self._bucket.rate

    @property
    def _tokens(self) -> float:
        return self._bucket.level

    def _refill(self, now: float) -> None:
        try:
            self._bucket.refill(now)
        except ValueError:
            raise ValueError(f"now: clock went backwards ({now} < {self._bucket.t})") from None

    def available(self, now: float) -> float:
        self._refill(now)
        return self._tokens

    def retry_after(self, n_writes: int, now: float) -> float:
        """Seconds until ``n_writes`` fit; ``inf`` when they never can (over capacity)."""
        self._refill(now)
        if n_writes > self.capacity:
            return math.inf
        return max(0.0, (n_writes - self._tokens) / self.rate)

    def admit(self, n_writes: int, now: float) -> bool:
        """Spend ``n_writes`` if they fit now; False (and nothing spent) if not."""
        if n_writes < 0:
            raise ValueError(f"n_writes: must be >= 0, got {n_writes}")
        self._refill(now)
        if n_writes <= self._tokens:
            self._bucket.level -= n_writes
            return True
        return False

    def require(self, n_writes: int, now: float) -> None:
        """``admit`` or raise ``WriteBudgetExceeded`` saying when to retry."""
        if not self.admit(n_writes, now):
            raise WriteBudgetExceeded(n_writes, self.retry_after(n_writes, now))
