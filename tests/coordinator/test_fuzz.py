"""Hostile frames (testkit/hostile.py) never crash the decoder or the core, close
only with documented codes, and an honest client keeps training beside them."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from testkit import hostile
from testkit.fuzzing import DOCUMENTED_CLOSES, fuzz
from tests.coordinator.coord_helpers import make_core

OPEN_ENDED = {"target_accuracy": None, "max_versions": 10**9, "patience": 0}


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_hostile_frames_never_crash_and_close_with_documented_codes(seed: int) -> None:
    report = fuzz(make_core(stop=OPEN_ENDED), 400, seed=seed)
    assert report.crashes == [], report.crashes[0][2]
    assert not report.undocumented_closes
    assert report.frames == 400


def test_every_kind_is_generated_and_the_honest_client_still_trains() -> None:
    report = fuzz(make_core(stop=OPEN_ENDED), 6000, seed=11, every=50)
    assert set(report.kinds) == set(hostile.KINDS)
    assert report.crashes == []
    assert set(report.closes) <= DOCUMENTED_CLOSES and len(report.closes) >= 5
    assert report.honest_accepted > 500  # about one result a millisecond: it keeps pace


def test_the_generator_replays_from_its_seed() -> None:
    a = [hostile.frame(random.Random(3), ["1", "2"]) for _ in range(1)]
    b = [hostile.frame(random.Random(3), ["1", "2"]) for _ in range(1)]
    assert a == b
