"""The desktop client as a real process: Ctrl-C says bye, refusals end it, it waits out
a coordinator that is not up yet, and a duty-cycled client still contributes."""

from __future__ import annotations

import json
import signal
import socket
import time
import urllib.request

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


def test_a_desktop_client_on_a_slow_link_moves_int8_down_and_int4_up() -> None:
    """On ``mobile`` links (250 kB/s) the model's fp32 round trip sets the task's
    length, so the coordinator sends the real client int8 models or int4 deltas
    from the version it holds and asks for int4 updates with stochastic rounding
    (codecs.slow_link auto); the job trains all the same."""
    job = digits_job(link={"profile": "mobile"}, stop={"max_versions": 6, "target_accuracy": None})
    nbytes = job.spec.nbytes
    with running(job) as (bg, service, rec), clients(bg.url, ["far"]) as procs:
        assert service.done.wait(120)
        assert procs["far"].wait(30) == 0
    accepted = rec.of(ev.ResultAccepted)
    assert len(accepted) >= 6
    assert all(0 < a.payload_bytes < nbytes / 6 for a in accepted)  # int4: 4.5 bits
    moved = [t for t in rec.of(ev.TaskLeased) if t.download in ("full", "delta")]
    assert moved and all(t.download_bytes < nbytes / 3 for t in moved)  # int8, or int4 deltas
    assert any(t.download == "delta" for t in moved)


def test_a_volunteers_data_cap_holds_on_a_lan_job() -> None:
    """``--max-mb-per-hour 360`` asks hello.limits for 50 kB/s each way on a lan job:
    the coordinator grants it, sends that volunteer int8 models and asks for int4
    updates (its round trip now sets its task's length) and paces its frames, so
    the bytes the dashboard counts for it stay within the cap; a neighbour without
    a cap keeps fp32 and lan speed."""
    job = digits_job(stop=OPEN_ENDED)
    rate = 360e6 / 3600 / 2  # bytes a second, each way
    with (
        running(job) as (bg, service, rec),
        clients(bg.url, ["capped"], "--max-mb-per-hour", "360"),
        clients(bg.url, ["free"]),
    ):

        def ids() -> dict[str, str]:
            return {j.name: j.client_id for j in rec.of(ev.ClientJoined)}

        def accepted(name: str) -> list[ev.ResultAccepted]:
            return [a for a in rec.of(ev.ResultAccepted) if a.client_id == ids().get(name)]

        assert rec.wait_for(lambda: len(accepted("capped")) >= 3, 120)
        assert rec.wait_for(lambda: len(accepted("free")) >= 3, 120)

        def dashboard() -> dict[str, dict]:
            with urllib.request.urlopen(f"{bg.http}/api/dashboard", timeout=30) as r:
                return {row["name"]: row for row in json.loads(r.read())["clients"]}

        # five seconds of it: long enough that the one-second bursts do not decide
        time.sleep(max(0.0, dashboard()["capped"]["joined"] + 5.0 - time.time()))
        rows, now = dashboard(), time.time()
        assert service.core is not None
        conns = dict(service.core.conns)  # (a copy: the core thread adds to it)
        granted = {name: conns[cid].limits for name, cid in ids().items()}
    assert granted["capped"].bytes_per_s == rate
    assert granted["free"].bytes_per_s > 100 * rate  # the job's lan
    nbytes = job.spec.nbytes
    assert all(a.payload_bytes < nbytes / 6 for a in accepted("capped"))  # int4
    assert all(a.payload_bytes > nbytes / 2 for a in accepted("free"))  # fp32
    capped = rows["capped"]
    span = now - capped["joined"]
    moved = capped["bytes_down"] + capped["bytes_up"]
    # Each direction's pacer: at most rate x T plus one burst (a second of rate)
    # and one frame over it (a chunk frame at this rate is a few kB).
    assert moved <= 2 * (rate * span + rate + 16_384), (moved, span)
    assert moved > rate * span / 4, (moved, span)  # and it kept training at its cap
    free = rows["free"]
    assert free["bytes_down"] + free["bytes_up"] > 4 * moved  # (what lan would have cost it)
