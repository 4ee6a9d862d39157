from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import CorruptDeltaLog, DeltaEntry, DeltaLog


def _entry(i: int, n: int = 10) -> DeltaEntry:
    return DeltaEntry(
        result_id=f"r{i}",
        base_version=i,
        version=i + 1,
        weight=0.25 * (i + 1),
        delta=np.arange(n, dtype=np.float32) * i,
        meta={"client": i % 3, "group": [0, 0, 4]},
    )


def test_append_replay_truncate(tmp_path: Path) -> None:
    with DeltaLog(tmp_path / "s.db") as log:
        assert log.append([_entry(0), _entry(1)]) == 2
        assert log.append([_entry(2)]) == 1
        got = list(log.replay())
        assert [e.result_id for e in got] == ["r0", "r1", "r2"]
        assert np.array_equal(got[2].delta, _entry(2).delta) and got[2].weight == 0.75
        assert got[1].meta == {"client": 1, "group": [0, 0, 4]}
        assert [e.version for e in log.replay(after_version=1)] == [2, 3]
        assert log.result_ids(after_version=2) == ["r2"]
        assert log.truncate(2) == 2 and len(log) == 1
    with DeltaLog(tmp_path / "s.db") as log:  # survives reopening
        assert [e.result_id for e in log.replay()] == ["r2"]


def test_reappending_a_result_is_idempotent(tmp_path: Path) -> None:
    with DeltaLog(tmp_path / "s.db") as log:
        log.append([_entry(0), _entry(1)])
        assert log.append([_entry(1), _entry(2)]) == 1
        assert [e.result_id for e in log.replay()] == ["r0", "r1", "r2"]
        assert log.append([]) == 0


def test_bad_entries_are_refused() -> None:
    with pytest.raises(ValueError, match="float32"):
        DeltaEntry(result_id="x", base_version=0, version=1, weight=1.0, delta=np.zeros(3))
    with pytest.raises(ValueError, match="result_id"):
        DeltaEntry(
            result_id="", base_version=0, version=1, weight=1.0, delta=np.zeros(3, np.float32)
        )


def test_an_entry_in_the_callers_form_comes_back_as_the_same_bytes(tmp_path: Path) -> None:
    """A payload (a journal's wire frames, 7 bytes here: no float32 length) is kept
    as it is, its meta as given, and a damaged one is reported like a delta."""
    empty = np.empty(0, np.float32)
    wired = DeltaEntry(result_id="w", base_version=0, version=1, weight=0.5, delta=empty,
                       meta={"clip": 0.25}, payload=b"\x01wire\xff\x00")  # fmt: skip
    assert wired.nbytes == 7 and _entry(1).nbytes == 40
    with DeltaLog(tmp_path / "s.db") as log:
        log.append([wired, _entry(1)])
        got = list(log.replay())
    assert got[0].payload == b"\x01wire\xff\x00" and got[0].delta.size == 0
    assert got[0].meta == {"clip": 0.25} and got[1].payload is None
    np.testing.assert_array_equal(got[1].delta, _entry(1).delta)
    with pytest.raises(ValueError, match="not both"):
        DeltaEntry(result_id="x", base_version=0, version=1, weight=1.0,
                   delta=np.zeros(3, np.float32), payload=b"x")  # fmt: skip
    with pytest.raises(ValueError, match="reserved"):
        DeltaEntry(result_id="x", base_version=0, version=1, weight=1.0, delta=empty,
                   meta={"_payload": True})  # fmt: skip
    conn = sqlite3.connect(tmp_path / "s.db")
    conn.execute("UPDATE deltas SET data = X'00' WHERE result_id='w'")
    conn.commit()
    conn.close()
    with DeltaLog(tmp_path / "s.db") as log, pytest.raises(CorruptDeltaLog, match="'w'"):
        list(log.replay())


def test_damage_at_rest_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with DeltaLog(path) as log:
        log.append([_entry(0), _entry(1)])
    conn = sqlite3.connect(path)
    conn.execute("UPDATE deltas SET data = zeroblob(40) WHERE result_id='r1'")
    conn.commit()
    conn.close()
    with DeltaLog(path) as log:
        it = log.replay()
        assert next(it).result_id == "r0"
        with pytest.raises(CorruptDeltaLog, match="r1"):
            next(it)


@settings(max_examples=20, deadline=None)
@given(batches=st.lists(st.integers(1, 6), min_size=1, max_size=8), cut=st.integers(0, 40))
def test_replay_is_append_order_after_any_truncation(
    tmp_path_factory: pytest.TempPathFactory, batches: list[int], cut: int
) -> None:
    path = tmp_path_factory.mktemp("log") / "s.db"
    with DeltaLog(path, synchronous="NORMAL") as log:
        i = 0
        for size in batches:
            log.append([_entry(i + k, 3) for k in range(size)])
            i += size
        log.truncate(cut)
        assert [e.version for e in log.replay()] == list(range(max(cut, 0) + 1, i + 1))
