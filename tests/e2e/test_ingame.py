"""The in-game client over a real websocket: a game loop on this thread, a real
coordinator on loopback; it trains until the job ends and leaves cleanly."""

from __future__ import annotations

import time

from websockets.sync.client import connect

from client.ingame import InGameClient
from coordinator.core import events as ev
from coordinator.core.config import JobConfig
from coordinator.runtime.service import CoreService
from protocol import messages as m
from tests.e2e.e2e_helpers import Recorder, digits_job, hello_frame, play_frames, running


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


def test_an_ingame_client_replaced_by_its_own_newer_connection_does_not_reconnect() -> None:
    """Close 4018 (REPLACED, docs/protocol.md §6): another connection resumed this
    client's session, which goes on there; reconnecting would take it back. The
    in-game client ends with exit code 2 instead, with a backoff that would have
    reconnected within a frame or two."""
    job = digits_job(stop={"target_accuracy": None, "max_versions": 1_000_000, "patience": 0})
    with running(job) as (bg, _service, rec):
        client = InGameClient(bg.url, name="game", flops=1e9, backoff_base=0.01, backoff_cap=0.02)
        deadline = time.monotonic() + 60
        while client.session.resume_token is None and time.monotonic() < deadline:
            client.step(0.004)
            time.sleep(1 / 60)
        token = client.session.resume_token
        assert token is not None, "the in-game client was never welcomed"
        with connect(bg.url, max_size=None, compression=None) as newer:
            newer.send(hello_frame("game", resume=token))
            while not isinstance(m.decode(newer.recv(timeout=10)), m.Welcome):
                pass
            play_frames(client, 10)  # ends at the close, or 10 s later
            frames = client.stats.frames
            for _ in range(60):  # a second more: no reconnect comes
                client.step(0.004)
                time.sleep(1 / 60)
            assert client.stats.frames == frames + 60
            assert rec.wait_for(lambda: len(rec.of(ev.ClientLeft)) >= 1)
    assert client.exit_code == 2 and client.finished == "replaced by a newer connection: close 4018"
    assert client.stats.connects == 1
    assert [j.resumed for j in rec.of(ev.ClientJoined)] == [False, True]
    assert rec.of(ev.ClientLeft)[0].reason == "closed: REPLACED"
