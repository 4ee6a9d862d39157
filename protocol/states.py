"""The two checks every sans-IO state machine here makes, written once: a
transition must be in its table, and the caller's clock must not go backwards.

Used by the coordinator core, the lease book, rounds, replication units, the
client session and the link buckets; each names itself in the error so a
driver's bug says where it happened.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Mapping
from typing import TypeVar

S = TypeVar("S", bound=enum.Enum)


def checked_move(
    what: str,
    table: Mapping[S, Collection[S]],
    state: S,
    to: S,
    error: type[Exception] = ValueError,
) -> S:
    """``to`` if ``state -> to`` is in ``table``, else ``error`` naming ``what``."""
    if to not in table[state]:
        raise error(f"{what}: {state.value} -> {to.value} not allowed")
    return to


def advance_clock(what: str, last: float, now: float) -> float:
    """``now`` as a float, after checking it is a number and not before ``last``
    (sans-IO parts take the time as input; a clock going back is the driver's bug)."""
    if isinstance(now, bool) or not isinstance(now, int | float) or math.isnan(now):
        raise ValueError(f"{what}: now must be a number, got {now!r}")
    if now < last:
        raise ValueError(f"{what}: time went backwards ({now} < {last})")
    return float(now)
