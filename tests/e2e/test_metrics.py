"""GET /metrics: Prometheus exposition that agrees with what happened (a real job,
real client processes, real websockets), named by Prometheus conventions."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect

from coordinator.core import events as ev
from protocol import messages as m
from tests.e2e.e2e_helpers import (
    HANG_GUARD_S,
    clients,
    digits_job,
    hello_frame,
    running,
    train_together,
)


def scrape(base: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """{sample name: {sorted labels: value}}."""
    text = httpx.get(f"{base}/metrics", timeout=10)
    assert text.status_code == 200
    assert text.headers["content-type"].startswith("text/plain; version=")
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text.text):
        assert family.name.startswith("crowdgrad_"), family.name
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples)
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def total(series: dict, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for k, v in series.items() if want <= set(k))


def test_metrics_agree_with_the_job(tmp_path) -> None:
    # merges warm up from half weight to full over the first 4 versions
    ramp = {"kind": "warmup-cosine", "start": 0.5, "warmup": 4, "versions": 4}
    job = digits_job(stop={"target_accuracy": 0.9}, strategy={"schedule": ramp})
    with running(job, store=tmp_path / "s.db") as (bg, service, rec):
        base = bg.url.replace("ws://", "http://").removesuffix("/ws")
        before = scrape(base)
        assert total(before["crowdgrad_clients"]) == 0
        assert before["crowdgrad_model_version"][()] == 0
        assert before["crowdgrad_step_scale"][()] == 0.5
        # both join before any result counts: alone, the first could finish the job
        train_together(bg.url, service, rec, ["m1", "m2"])
        assert rec.wait_for(lambda: bool(rec.of(ev.JobFinished)), timeout=HANG_GUARD_S)
        assert rec.wait_for(lambda: service.stats.checkpoints >= 1, timeout=30)
        got = scrape(base)
        joins = got["crowdgrad_client_joins_total"]
        assert total(joins, kind="other") == len(rec.of(ev.ClientJoined)) >= 2
        # the finished job said bye to both: the gauge is back where it started
        assert total(got["crowdgrad_clients"]) == len(rec.of(ev.ClientJoined)) - len(
            rec.of(ev.ClientLeft)
        )
        accepted = len(rec.of(ev.ResultAccepted))
        assert total(got["crowdgrad_results_total"], outcome="accepted") == accepted
        assert got["crowdgrad_task_round_trip_seconds_count"][()] == accepted
        leased = len(rec.of(ev.TaskLeased))
        assert total(got["crowdgrad_tasks_leased_total"]) == leased
        # results in: the accepted ones, and any that came after the job ended (acked stale)
        assert total(got["crowdgrad_messages_total"], direction="in", type="result") >= accepted
        assert total(got["crowdgrad_messages_total"], direction="in", type="hello") == 2
        assert total(got["crowdgrad_messages_total"], direction="out", type="task") == leased
        assert total(got["crowdgrad_message_bytes_total"], direction="out") > 0
        last = rec.of(ev.Evaluated)[-1]
        assert got["crowdgrad_last_evaluation_accuracy"][()] == last.accuracy
        assert got["crowdgrad_evaluations_total"][()] == len(rec.of(ev.Evaluated))
        assert got["crowdgrad_model_version"][()] == service.stats.version > 4
        assert got["crowdgrad_step_scale"][()] == 1.0
        assert got["crowdgrad_checkpoint_seconds_count"][()] >= 1
        assert got["crowdgrad_job_finished"][()] == 1


def test_heartbeat_rtt_from_echoed_heartbeats() -> None:
    """A client echoing the server's heartbeat ``time`` with ``held`` gives one RTT
    sample each (docs/protocol.md §3.7); an echo without ``held`` (an older client's)
    gives none."""

    async def peer(url: str) -> None:
        async with connect(url, max_size=None, compression=None) as ws:
            await ws.send(hello_frame("rtt"))

            async def heartbeat() -> m.Heartbeat:
                async for frame in ws:
                    msg = m.decode(frame)
                    if isinstance(msg, m.Heartbeat):
                        return msg
                raise AssertionError("closed before a heartbeat came")

            await ws.send(m.encode(m.Heartbeat(seq=1, time=0.0)))
            theirs = await heartbeat()
            await ws.send(m.encode(m.Heartbeat(seq=2, time=1.0, echo=theirs.time, held=0.0)))
            await heartbeat()
            await ws.send(m.encode(m.Heartbeat(seq=3, time=2.0, echo=theirs.time)))  # no held
            await heartbeat()

    with running(digits_job()) as (bg, _, _):
        asyncio.run(asyncio.wait_for(peer(bg.url), 60))
        got = scrape(bg.url.replace("ws://", "http://").removesuffix("/ws"))
    assert got["crowdgrad_heartbeat_rtt_seconds_count"][()] == 1
    assert 0 <= got["crowdgrad_heartbeat_rtt_seconds_sum"][()] < 60


def test_an_auto_outer_lr_steps_real_rounds_and_shows_as_a_gauge(tmp_path) -> None:
    """DiLoCo rounds with ``outer_lr = "auto"`` on real websockets: the job reaches
    its target, and the gauge shows the last round's lr, between the floor and
    the peak (0.95 of Nesterov's edge at momentum 0.9)."""
    strategy = {"outer_optimizer": "nesterov", "outer_momentum": 0.9, "outer_lr": "auto"}
    job = digits_job(
        "decentral-sync",
        strategy={**strategy, "clients_per_round": 2},
        stop={"target_accuracy": 0.9},
        eval={"every_versions": 1},
    )
    with running(job, store=tmp_path / "s.db") as (bg, service, rec):
        base = bg.url.replace("ws://", "http://").removesuffix("/ws")
        with clients(bg.url, ["m1", "m2"]):
            assert rec.wait_for(lambda: bool(rec.of(ev.JobFinished)), timeout=HANG_GUARD_S)
            got = scrape(base)
        lr = got["crowdgrad_outer_lr"][()]
        assert lr == service.core.strategy.round_outer_lr()
        assert 0.05 * 1.29 <= lr <= 1.29
        assert rec.of(ev.Evaluated)[-1].accuracy >= 0.9
