"""Coordinator state survives a trip through a real checkpoint store, bitwise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from coordinator.core.assembly import build_core, restore_core
from coordinator.core.config import parse_job
from coordinator.runtime.persist import from_checkpoint, to_checkpoint
from nn.data import load_dataset
from nn.spec import ModelSpec
from storage.layout import Checkpoint
from storage.store import CheckpointStore
from testkit.loopback import Loopback


@pytest.mark.parametrize("strategy", ["decentral-async", "decentral-sync", "central-sync"])
def test_state_round_trips_through_the_store(strategy: str, tmp_path: Path) -> None:
    job = parse_job(
        {
            "model": {"widths": [64, 16, 10]},
            "data": {"shards": 4, "batch": 8},
            "strategy": {"name": strategy, "tau": 2, "clients_per_round": 2},
            "stop": {"max_versions": 3},
        }
    )
    data = load_dataset("digits", seed=0)
    core = build_core(job, seed=1, dataset=data)
    lb = Loopback(core)
    for i in range(3):
        lb.add_client(f"c{i}")
    lb.run(until=100)
    state = core.state_dict()
    with CheckpointStore.open(tmp_path / "s.db") as store:
        store.save(to_checkpoint(job, state, created_at=0.0))
        back = from_checkpoint(store.load_latest())
    assert set(back) == set(state)
    assert back["finished"] == state["finished"]  # why it ended survives the store
    assert back["finished"]["reason"] == "max_versions"
    np.testing.assert_array_equal(back["params"], state["params"])
    restored = restore_core(job, back, 1, dataset=data)
    assert restored.version == core.version
    assert restored.params.array_equal(core.params)
    assert restored.state_dict()["strategy"].keys() == state["strategy"].keys()


def test_a_foreign_checkpoint_is_refused_by_name() -> None:
    params = ModelSpec(widths=(4, 3)).init_params(0)
    with pytest.raises(ValueError, match="not written by a coordinator"):
        from_checkpoint(Checkpoint(version=1, created_at=0.0, params=params))
