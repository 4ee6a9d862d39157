"""Churn: how long a client stays connected and how long it stays away.

A scenario gives either explicit distributions (``session``, ``rejoin``) or a
rate, "x % of the connected clients drop per minute". A rate means a memoryless
client: its session length is exponential with hazard ``λ = -ln(1 - x) / 60``
per second, so the chance to drop within any minute is exactly ``x``.

:class:`Lifecycle` puts one client's leave/join events on the engine at
``Priority.CHURN``: a drop at the same instant as a frame's delivery wins, and
the frame is lost. Drops fall at arbitrary virtual times, so they land in the
middle of messages and computations, which is the point.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from simulations.distributions import Distribution, Exponential, parse
from simulations.engine import Engine, Event, Priority

#: Rejoin delay when a rate is given without one: a player reloads in about 30 s.
DEFAULT_REJOIN = Exponential(mean_=30.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChurnModel:
    """``session``/``rejoin`` None mean "stays forever" / "never comes back"."""

    session: Distribution | None = None
    rejoin: Distribution | None = None

    @classmethod
    def none(cls) -> ChurnModel:
        return cls()

    @classmethod
    def per_minute(
        cls, fraction: float, *, rejoin: Distribution | None = DEFAULT_REJOIN
    ) -> ChurnModel:
        """``fraction`` of connected clients drop per minute (0 ≤ fraction < 1)."""
        if not 0.0 <= fraction < 1.0:
            raise ValueError(f"churn.drop_per_minute: must be in [0, 1), got {fraction!r}")
        if fraction == 0.0:
            return cls(rejoin=rejoin)
        rate = -math.log1p(-fraction) / 60.0
        return cls(session=Exponential(mean_=1.0 / rate), rejoin=rejoin)

    @classmethod
    def from_table(cls, table: Mapping[str, Any], where: str = "churn") -> ChurnModel:
        """``{drop_per_minute = 0.1}`` or ``{session = {...}, rejoin = {...}}``."""
        allowed = {"drop_per_minute", "session", "rejoin"}
        extra = sorted(set(table) - allowed)
        if extra:
            raise ValueError(f"{where}: unknown field(s) {extra}; expected {sorted(allowed)}")
        rejoin = parse(table["rejoin"], f"{where}.rejoin") if "rejoin" in table else None
        if "drop_per_minute" in table:
            if "session" in table:
                raise ValueError(f"{where}: give drop_per_minute or session, not both")
            frac = table["drop_per_minute"]
            if isinstance(frac, bool) or not isinstance(frac, int | float):
                raise ValueError(f"{where}.drop_per_minute: expected a number, got {frac!r}")
            return cls.per_minute(float(frac), rejoin=rejoin or DEFAULT_REJOIN)
        session = parse(table["session"], f"{where}.session") if "session" in table else None
        return cls(session=session, rejoin=rejoin)

    @property
    def drop_per_minute(self) -> float:
        """Expected fraction of connected clients dropping per minute (for reports)."""
        if self.session is None:
            return 0.0
        return 1.0 - math.exp(-60.0 / self.session.mean)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if self.session is not None:
            d["session"] = self.session.to_dict()
        if self.rejoin is not None:
            d["rejoin"] = self.rejoin.to_dict()
        return d


class Lifecycle:
    """Schedules one client's leaves and rejoins; the driver supplies the verbs.

    Call order: ``start()`` once when the client first connects; ``on_leave`` and
    ``on_join`` are then called alternately by the engine. ``stop()`` cancels
    whatever is pending (the run is over or the client is retired).
    """

    def __init__(
        self,
        engine: Engine,
        model: ChurnModel,
        *,
        name: str,
        on_leave: Callable[[], None],
        on_join: Callable[[], None],
    ) -> None:
        self.engine = engine
        self.model = model
        self.rng = engine.rng(f"churn/{name}")
        self.on_leave = on_leave
        self.on_join = on_join
        self.pending: Event | None = None
        self.sessions = 0
        self.drops = 0

    def start(self) -> None:
        self.sessions += 1
        self._plan_leave()

    def _plan_leave(self) -> None:
        if self.model.session is None:
            return
        length = self.model.session.sample(self.rng)
        self.pending = self.engine.schedule(length, self._leave, priority=Priority.CHURN)

    def _leave(self) -> None:
        self.drops += 1
        self.pending = None
        self.on_leave()
        if self.model.rejoin is not None:
            delay = self.model.rejoin.sample(self.rng)
            self.pending = self.engine.schedule(delay, self._join, priority=Priority.CHURN)

    def _join(self) -> None:
        self.pending = None
        self.sessions += 1
        self.on_join()
        self._plan_leave()

    def stop(self) -> None:
        self.engine.cancel(self.pending)
        self.pending = None
