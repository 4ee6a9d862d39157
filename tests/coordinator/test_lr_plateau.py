"""strategies/plateau.py: the lr cut on held-out plateaus, shared by the crowd and
the one-machine anchor."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from coordinator.core.strategies.plateau import LrPlateau


def test_a_cut_needs_patience_evaluations_and_patience_rounds() -> None:
    p = LrPlateau(patience=3, factor=0.5, minimum=0.125)
    assert not p.observe(1.0, at=0)  # the first best
    # three evaluations without a new best, but only 3 versions at K = 4: no cut
    assert [p.observe(1.1, at=v, per=4) for v in (1, 2, 3)] == [False] * 3
    assert p.decay == 1.0
    assert p.observe(1.2, at=12, per=4)  # 12 versions = 3 rounds of 4
    assert p.decay == 0.5 and p.since_best == 0 and p.best_at == 12
    assert not p.observe(0.9, at=13) and p.best == 0.9  # a new best resets the count


def test_nan_is_no_evidence() -> None:
    p = LrPlateau(patience=1, factor=0.5, minimum=0.1)
    p.observe(1.0, at=0)
    assert not p.observe(math.nan, at=5) and p.since_best == 0 and p.decay == 1.0


@given(st.lists(st.tuples(st.floats(0, 10), st.integers(0, 5)), max_size=200))
def test_the_multiplier_only_falls_and_stays_at_or_above_its_minimum(steps) -> None:
    p = LrPlateau(patience=2, factor=0.5, minimum=0.125)
    at, last = 0, 1.0
    for loss, gap in steps:
        at += gap
        cut = p.observe(loss, at)
        assert p.decay <= last and p.decay >= 0.125
        assert cut == (p.decay < last)
        last = p.decay
