"""One paced outbox: frames wait in order until the link's buckets let them go.

The coordinator core keeps one per connection and the client session one for its
link; both push a frame with its size, ``flush(now)`` takes every frame now due
(in order: a frame never overtakes the one before it), and
``next_send_time(now)`` says when the head may go, which is what a driver's next
wake-up needs. Without a pacer (a session before ``welcome`` grants limits)
everything is due at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar

from protocol.limits import Pacer

T = TypeVar("T")


class PacedOutbox(Generic[T]):
    """Items (with their frame sizes) in send order, released by a :class:`Pacer`."""

    __slots__ = ("_items", "pacer")

    def __init__(self, pacer: Pacer | None = None) -> None:
        self.pacer = pacer
        self._items: deque[tuple[T, int]] = deque()

    def push(self, item: T, nbytes: int) -> None:
        self._items.append((item, nbytes))

    def flush(self, now: float, into: list[T]) -> None:
        """Append to ``into`` every item due at ``now``, oldest first."""
        items, pacer = self._items, self.pacer
        while items:
            item, n = items[0]
            if pacer is not None and not pacer.try_consume(n, now):
                return
            items.popleft()
            into.append(item)

    def next_send_time(self, now: float) -> float | None:
        """When the head may go (``now`` if it may now); None when empty."""
        if not self._items:
            return None
        if self.pacer is None:
            return now
        return self.pacer.next_send_time(self._items[0][1], now)

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[T]:
        return (item for item, _ in self._items)
