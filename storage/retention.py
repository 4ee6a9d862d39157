"""Which checkpoint versions to keep: the last N and every K-th, never the newest."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionPolicy:
    """Keep the ``keep_last`` newest versions and every version divisible by ``keep_every``.

    ``keep_every`` counts model versions, not saves, so the kept history is the
    same whatever the checkpoint interval was.
    """

    keep_last: int = 5
    keep_every: int | None = None

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise ValueError(f"keep_last: must be >= 1, got {self.keep_last}")
        if self.keep_every is not None and self.keep_every < 1:
            raise ValueError(f"keep_every: must be >= 1, got {self.keep_every}")

    def to_delete(self, versions: Iterable[int]) -> list[int]:
        """The versions this policy drops, ascending; a pure function of the set."""
        vs = sorted(set(versions))
        keep = set(vs[-self.keep_last :])
        if self.keep_every is not None:
            keep.update(v for v in vs if v % self.keep_every == 0)
        return [v for v in vs if v not in keep]
