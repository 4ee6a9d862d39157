"""Hostile frames over real sockets (testkit/netfuzz.py): many connections from
127.0.0.0/8, each a valid hello and then hostile frames, through uvicorn, the
websocket layer and admission, while a real client process trains beside them.
The server closes each with a documented code, never crashes, and the honest
client keeps getting results accepted."""

from __future__ import annotations

import asyncio

from coordinator.core import events as ev
from testkit.netfuzz import fuzz_server
from tests.e2e.e2e_helpers import HANG_GUARD_S, clients, digits_job, running

OPEN_ENDED = {"target_accuracy": None, "max_versions": 1_000_000, "max_time_s": None, "patience": 0}


def test_hostile_frames_over_real_sockets_close_cleanly_beside_an_honest_client() -> None:
    with running(digits_job(stop=OPEN_ENDED)) as (bg, service, rec):
        with clients(bg.url, ["honest"], "--anonymous", "--no-cache"):
            assert rec.wait_for(lambda: len(rec.of(ev.ResultAccepted)) >= 2, HANG_GUARD_S)
            before = len(rec.of(ev.ResultAccepted))
            report = asyncio.run(fuzz_server(bg.url, 6000, seed=7, workers=8))
            assert rec.wait_for(lambda: len(rec.of(ev.ResultAccepted)) > before, HANG_GUARD_S)
        assert report.frames == 6000 and report.connections > 100
        assert set(report.kinds) == {
            "wrong_type", "truncated", "bad_ext", "huge_length", "deep", "trailing",
            "random_bytes", "wrong_time", "cross_session",
        }  # fmt: skip
        assert report.undocumented_closes == {}
        assert report.not_welcomed == 0 and not report.refused
        assert sum(report.closes.values()) >= report.connections - 8
        assert not service.stopped.is_set()  # the core thread never crashed
        honest = {o.client_id for o in rec.of(ev.ResultAccepted)}
        assert len(honest) == 1  # only the honest client's results went in
