"""The in-game client over a real websocket: a game loop on this thread, a real
coordinator on loopback; it trains until the job ends and leaves cleanly."""

from __future__ import annotations

import time

from client.ingame import InGameClient
from coordinator import events as ev
from tests.e2e.e2e_helpers import digits_job, running


def _play(client: InGameClient, seconds: float = 60) -> None:
    """The game's loop: a frame at 60 Hz with 4 ms for the client, until it ends."""
    deadline = time.monotonic() + seconds
    while client.finished is None and time.monotonic() < deadline:
        client.step(0.004)
        time.sleep(1 / 60)
    for _ in range(30):  # the closing handshake finishes on later frames
        client.step(0.004)


def test_ingame_client_trains_both_blocks_of_a_layer_split_job() -> None:
    """A layer-split job (docs/protocol.md §3.3.2) with the in-game client alone:
    its lower tasks return their rows' boundary, its upper tasks train on it."""
    job = digits_job(
        model={"widths": [64, 64, 32, 10]},
        strategy={"window": 1},
        split={"cut": 1},
        stop={"max_versions": 8, "target_accuracy": None},
    )
    with running(job) as (bg, service, rec):
        client = InGameClient(bg.url, name="game")
        client.warm_up(budget_s=0.05)
        _play(client)
        assert service.done.wait(10)
    assert client.finished is not None and client.exit_code == 0, client.finished
    assert not rec.of(ev.ResultRejected)
    split = service.stats.split
    assert split is not None and split["lower_steps"] > 0 and split["upper_steps"] > 0


def test_ingame_client_trains_to_the_end_of_the_job() -> None:
    job = digits_job(stop={"max_versions": 6, "target_accuracy": None})
    with running(job) as (bg, service, rec):
        client = InGameClient(bg.url, name="game")
        client.warm_up(budget_s=0.05)
        _play(client)
        assert service.done.wait(10)
    assert client.finished is not None and client.exit_code == 0, client.finished
    accepted = rec.of(ev.ResultAccepted)
    assert len(accepted) >= 6 and client.stats.results >= 6
    assert client.stats.connects == 1 and client.stats.steps >= 6 * 10  # tau 10
    assert {j.name for j in rec.of(ev.ClientJoined)} == {"game"}
