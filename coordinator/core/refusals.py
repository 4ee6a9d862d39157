"""Who was closed for refused updates, remembered past the connection.

A client whose updates are refused ``validation.max_rejections`` times is
closed; its count lived on its session record, so reconnecting without the
resume token (a fresh record) came back with a clean count, bounded only by
the per-address session rate (issue 34). This remembers each such close by the
peer's address and by its resume id: a new connection from a marked address,
or resuming a marked session, starts *on probation*, one refusal short of the
limit, so its first refused update closes it again. Accepted results fade that
count as they fade any (results.py), so an honest client that shares a marked
address (a NAT) earns its way off probation; a poisoner never does.

Bounded: at most ``max_keys`` marks, the oldest dropped first, and each lasts
``ttl_s`` from the latest close it records.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

#: Marks kept at most (address and resume id keys together).
MAX_KEYS = 10_000
#: Seconds a mark lasts after the close it records.
TTL_S = 3600.0


class RefusalMarks:
    """Marks by key (``addr:<ip>``, ``resume:<id>``) with the time of the last close."""

    __slots__ = ("_marks", "max_keys", "ttl_s")

    def __init__(self, *, max_keys: int = MAX_KEYS, ttl_s: float = TTL_S) -> None:
        if max_keys < 1 or not ttl_s > 0:
            raise ValueError(f"max_keys >= 1 and ttl_s > 0, got {max_keys}, {ttl_s}")
        self.max_keys = max_keys
        self.ttl_s = ttl_s
        self._marks: OrderedDict[str, float] = OrderedDict()

    @staticmethod
    def keys(address: str | None, resume_id: str | None) -> list[str]:
        out = [] if address is None else [f"addr:{address}"]
        return out if not resume_id else [*out, f"resume:{resume_id}"]

    def mark(self, keys: Iterable[str], now: float) -> None:
        for key in keys:
            self._marks.pop(key, None)
            self._marks[key] = now
        while len(self._marks) > self.max_keys:
            self._marks.popitem(last=False)

    def marked(self, keys: Iterable[str], now: float) -> bool:
        """Whether any of ``keys`` was closed for refusals within ``ttl_s``."""
        found = False
        for key in keys:
            at = self._marks.get(key)
            if at is None:
                continue
            if now - at > self.ttl_s:
                del self._marks[key]
            else:
                found = True
        return found

    def __len__(self) -> int:
        return len(self._marks)
