from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage import StoreLimits, WriteBudget, WriteBudgetExceeded


def test_seed_datastore_limits() -> None:
    limits = StoreLimits.seed_datastore(players=8)
    assert limits.max_chunk_bytes == 4_000_000
    assert limits.writes_per_minute == 60 + 10 * 8
    assert StoreLimits().budget() is None


def test_bad_limits_name_the_field() -> None:
    with pytest.raises(ValueError, match="max_chunk_bytes"):
        StoreLimits(max_chunk_bytes=10)
    with pytest.raises(ValueError, match="writes_per_minute"):
        StoreLimits(writes_per_minute=0)
    with pytest.raises(ValueError, match="players"):
        StoreLimits.seed_datastore(players=-1)


def test_budget_refuses_then_refills() -> None:
    b = WriteBudget(writes_per_minute=60)  # one write a second, a minute of burst
    assert b.admit(60, now=0.0)
    assert not b.admit(1, now=0.0)
    assert b.retry_after(5, now=0.0) == pytest.approx(5.0)
    with pytest.raises(WriteBudgetExceeded) as exc:
        b.require(5, now=1.0)
    assert exc.value.retry_after == pytest.approx(4.0)
    assert b.admit(5, now=5.0)
    assert b.retry_after(61, now=5.0) == math.inf


def test_clock_going_backwards_is_a_caller_bug() -> None:
    b = WriteBudget(writes_per_minute=60)
    b.admit(1, now=10.0)
    with pytest.raises(ValueError, match="backwards"):
        b.admit(1, now=9.0)


@given(
    rate=st.integers(1, 600),
    steps=st.lists(st.tuples(st.floats(0, 30), st.integers(0, 50)), max_size=60),
)
def test_budget_never_admits_more_than_capacity_plus_refill(rate: int, steps: list) -> None:
    b = WriteBudget(writes_per_minute=rate)
    now, admitted = 0.0, 0
    for dt, n in steps:
        now += dt
        if b.admit(n, now):
            admitted += n
        assert admitted <= rate + now * rate / 60 + 1e-6
