"""VersionHistory: deltas against recent versions, None when too old."""

from __future__ import annotations

import numpy as np
import pytest

from compression.versions import VersionHistory


def test_delta_and_eviction() -> None:
    h = VersionHistory(3)
    snaps = [np.full(5, float(v), np.float32) for v in range(6)]
    for v, s in enumerate(snaps):
        h.push(v, s)
    snaps[5][:] = 99.0  # push copies: later writes by the caller do not leak in
    assert h.latest == 5 and h.versions() == [3, 4, 5] and len(h) == 3
    np.testing.assert_array_equal(h.delta(3), np.full(5, 2.0, np.float32))
    np.testing.assert_array_equal(h.delta(5), np.zeros(5, np.float32))
    assert h.delta(2) is None and 2 not in h and 4 in h
    base = h.get(3)
    assert base is not None and not base.flags.writeable
    assert h.get(0) is None


def test_bad_pushes() -> None:
    h = VersionHistory(2)
    with pytest.raises(LookupError):
        _ = h.latest
    h.push(1, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="not after"):
        h.push(1, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="earlier versions"):
        h.push(2, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="float32"):
        h.push(2, np.zeros(3, np.float64))
    with pytest.raises(ValueError, match="max_versions"):
        VersionHistory(0)
