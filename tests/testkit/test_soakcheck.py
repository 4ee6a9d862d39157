"""The soak's ledger and store check: what counts as an ack, and a loss found."""

from __future__ import annotations

from pathlib import Path

from nn.spec import ModelSpec
from storage import Checkpoint, CheckpointStore
from testkit.soakcheck import Ledger, check_store, slope_mb_per_min


def test_the_ledger_names_each_connection_by_its_hello_and_keeps_promising_acks() -> None:
    ledger = Ledger()
    ledger(4, "up", {"type": "hello", "client": "soak-2"})
    ledger(4, "down", {"type": "welcome", "session_id": "s"})
    for task, ok, why in (("1", True, ""), ("2", False, "duplicate"), ("3", False, "stale")):
        ledger(4, "down", {"type": "ack", "task_id": task, "accepted": ok, "reason": why})
    ledger(5, "down", {"type": "ack", "task_id": "9", "accepted": True})
    ledger(4, "down", {"type": "task", "task_id": "10"})
    events, at = ledger.since(0)
    assert at == 5 and [e.kind for e in events] == ["welcome", "ack", "ack", "ack", "ack"]
    assert [e.task_id for e in events if e.promises] == ["1", "2", "9"]
    assert {e.client for e in events} == {"soak-2", ""}
    assert ledger.since(at) == ([], 5)


def test_an_acknowledged_id_missing_from_the_newest_checkpoint_is_lost(tmp_path: Path) -> None:
    path, spec = tmp_path / "s.db", ModelSpec.preset("tiny")
    assert check_store(path, {"1"}).lost == ("1",)  # nothing stored: all of it lost
    with CheckpointStore.open(path) as store:
        for v, applied in ((1, ("1", "2")), (2, ("2", "3"))):
            store.save(Checkpoint(version=v, created_at=0.0, params=spec.init_params(v),
                                  applied_results=applied))  # fmt: skip
    ok = check_store(path, {"2", "3"})
    assert (ok.version, ok.lost, ok.corrupt, ok.checked) == (2, (), (), 2)
    assert check_store(path, {"1", "3", "10"}).lost == ("1", "10")  # v2 is what restores


def test_the_rss_slope_is_megabytes_a_minute() -> None:
    assert slope_mb_per_min([(0, 100), (30, 101), (60, 102)]) == 2.0
    assert slope_mb_per_min([(0, 100), (60, 100)]) is None
