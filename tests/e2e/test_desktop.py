"""The desktop client as a real process: Ctrl-C says bye, refusals end it, it waits out
a coordinator that is not up yet, and a duty-cycled client still contributes."""

from __future__ import annotations

import signal
import socket

from coordinator.core import events as ev
from coordinator.http.server import CrowdServer
from coordinator.http.serving import BackgroundServer
from coordinator.runtime.service import CoreService
from tests.e2e.e2e_helpers import Recorder, clients, digits_job, running

OPEN_ENDED = {"target_accuracy": None, "max_versions": 1_000_000, "max_time_s": None, "patience": 0}


def test_ctrl_c_says_bye_and_exits_zero() -> None:
    with running(digits_job(stop=OPEN_ENDED)) as (bg, _, rec), clients(bg.url, ["me"]) as procs:
        assert rec.wait_for(lambda: len(rec.of(ev.ResultAccepted)) >= 2, 60)
        procs["me"].send_signal(signal.SIGINT)
        assert procs["me"].wait(30) == 0
        assert rec.wait_for(lambda: bool(rec.of(ev.ClientLeft)), 10)
    assert rec.of(ev.ClientLeft)[-1].reason == "bye: client stopping"


def test_wrong_token_ends_the_client_with_code_2() -> None:
    with (
        running(digits_job(), join_token="right") as (bg, _, _),
        clients(bg.url, ["intruder"], "--token", "wrong") as procs,
    ):
        assert procs["intruder"].wait(60) == 2


def test_client_waits_for_a_coordinator_that_starts_later() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"ws://127.0.0.1:{port}/ws"
    with clients(url, ["early"]) as procs:
        service = CoreService(digits_job(stop={"max_versions": 5, "target_accuracy": None}))
        rec = Recorder()
        service.add_sink(rec)
        crowd = CrowdServer(service)
        # the port the client has been retrying
        with BackgroundServer(crowd, port=port):
            assert service.done.wait(60)
            assert procs["early"].wait(30) == 0
    assert {o.client_id for o in rec.of(ev.ResultAccepted)}


def test_duty_cycled_client_contributes() -> None:
    job = digits_job(stop={"max_versions": 4, "target_accuracy": None})
    with running(job) as (bg, service, rec), clients(bg.url, ["half"], "--cpu-share", "0.5") as p:
        assert service.done.wait(60)
        assert p["half"].wait(30) == 0
    assert len(rec.of(ev.ResultAccepted)) >= 4


def test_a_desktop_client_on_a_slow_link_moves_int8_both_ways() -> None:
    """On ``mobile`` links (250 kB/s) the model's fp32 round trip sets the task's
    length, so the coordinator sends the real client int8 models and asks for int8
    updates (codecs.slow_link auto); the job trains all the same."""
    job = digits_job(link={"profile": "mobile"}, stop={"max_versions": 6, "target_accuracy": None})
    nbytes = job.spec.nbytes
    with running(job) as (bg, service, rec), clients(bg.url, ["far"]) as procs:
        assert service.done.wait(120)
        assert procs["far"].wait(30) == 0
    accepted = rec.of(ev.ResultAccepted)
    assert len(accepted) >= 6
    assert all(0 < a.payload_bytes < nbytes / 3 for a in accepted)
    full = [t for t in rec.of(ev.TaskLeased) if t.download == "full"]
    assert full and all(t.download_bytes < nbytes / 3 for t in full)
