from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage import RetentionPolicy


def test_keep_last_and_every_kth() -> None:
    policy = RetentionPolicy(keep_last=2, keep_every=10)
    assert policy.to_delete([1, 5, 10, 15, 20, 21, 22]) == [1, 5, 15]


def test_bad_policy_names_the_field() -> None:
    with pytest.raises(ValueError, match="keep_last"):
        RetentionPolicy(keep_last=0)
    with pytest.raises(ValueError, match="keep_every"):
        RetentionPolicy(keep_every=0)


@given(
    versions=st.sets(st.integers(0, 500), min_size=1, max_size=60),
    keep_last=st.integers(1, 10),
    keep_every=st.none() | st.integers(1, 50),
)
def test_newest_always_kept_and_only_unprotected_dropped(
    versions: set[int], keep_last: int, keep_every: int | None
) -> None:
    policy = RetentionPolicy(keep_last=keep_last, keep_every=keep_every)
    dropped = policy.to_delete(versions)
    kept = versions - set(dropped)
    assert max(versions) in kept
    assert sorted(versions)[-keep_last:] == sorted(kept)[-min(keep_last, len(kept)) :]
    for v in dropped:
        assert keep_every is None or v % keep_every
