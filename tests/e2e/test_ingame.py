"""The in-game client over a real websocket: a game loop on this thread, a real
coordinator on loopback; it trains until the job ends and leaves cleanly."""

from __future__ import annotations

from client.ingame import InGameClient
from coordinator.core import events as ev
from coordinator.core.config import JobConfig
from coordinator.runtime.service import CoreService
from tests.e2e.e2e_helpers import Recorder, digits_job, play_frames, running


def _train(job: JobConfig) -> tuple[InGameClient, CoreService, Recorder]:
    """The in-game client alone plays ``job`` to its end and leaves cleanly."""
    with running(job) as (bg, service, rec):
        client = InGameClient(bg.url, name="game")
        client.warm_up(budget_s=0.05)
        play_frames(client, 60)
        assert service.done.wait(10)
    assert client.finished is not None and client.exit_code == 0, client.finished
    return client, service, rec


def test_ingame_client_trains_both_blocks_of_a_layer_split_job() -> None:
    """A layer-split job (docs/protocol.md §3.3.2) with the in-game client alone:
    its lower tasks return their rows' boundary, its upper tasks train on it."""
    job = digits_job(
        model={"widths": [64, 64, 32, 10]},
        strategy={"window": 1},
        split={"cut": 1},
        stop={"max_versions": 8, "target_accuracy": None},
    )
    _, service, rec = _train(job)
    assert not rec.of(ev.ResultRejected)
    split = service.stats.split
    assert split is not None and split["lower_steps"] > 0 and split["upper_steps"] > 0


def test_ingame_client_trains_to_the_end_of_the_job() -> None:
    client, _, rec = _train(digits_job(stop={"max_versions": 6, "target_accuracy": None}))
    accepted = rec.of(ev.ResultAccepted)
    assert len(accepted) >= 6 and client.stats.results >= 6
    assert client.stats.connects == 1 and client.stats.steps >= 6 * 10  # tau 10
    assert {j.name for j in rec.of(ev.ClientJoined)} == {"game"}
