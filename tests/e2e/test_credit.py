"""Credit over real sockets: a desktop volunteer's key lives in its cache folder,
owner-only, and the credit it earns is kept under it across runs, served at
/api/credit and /api/credit/{volunteer} and described in the OpenAPI schema."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request

import pytest

from coordinator.core import events as ev
from protocol.volunteer import volunteer_id
from tests.e2e.e2e_helpers import HANG_GUARD_S, clients, digits_job, running

OPEN_ENDED = {"target_accuracy": None, "max_versions": 1_000_000, "max_time_s": None, "patience": 0}


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def test_a_desktop_volunteer_keeps_its_credit_across_runs(tmp_path) -> None:
    with running(digits_job(stop=OPEN_ENDED)) as (bg, _, rec):
        earned = 0.0
        for run, name in enumerate(["ada", "ada-again"]):
            before = len(rec.of(ev.ResultAccepted))
            with clients(bg.url, [name], "--cache-dir", str(tmp_path)) as procs:
                assert rec.wait_for(lambda b=before: len(rec.of(ev.ResultAccepted)) >= b + 3,
                                    HANG_GUARD_S)  # fmt: skip
                procs[name].send_signal(signal.SIGINT)
                assert procs[name].wait(30) == 0
            key = tmp_path / "volunteer.key"
            assert key.stat().st_mode & 0o777 == 0o600
            vid = volunteer_id(key.read_text().strip())
            acct = _get(f"{bg.http}/api/credit/{vid}")
            assert acct["name"] == name and acct["rank"] == 1
            assert acct["results"] >= 3 * (run + 1) and acct["flops"] > earned
            earned = acct["flops"]
        page = _get(f"{bg.http}/api/credit?offset=0&limit=10")
        assert page["total"] == 1 and page["volunteers"][0]["volunteer"] == vid
        assert page["total_flops"] == pytest.approx(page["volunteers"][0]["flops"])
        with pytest.raises(urllib.error.HTTPError) as missing:
            _get(f"{bg.http}/api/credit/0000000000000000")
        assert missing.value.code == 404
        with pytest.raises(urllib.error.HTTPError) as bad:
            _get(f"{bg.http}/api/credit?limit=100000")
        assert bad.value.code == 422
        paths = _get(f"{bg.http}/openapi.json")["paths"]
        assert "/api/credit" in paths and "/api/credit/{volunteer}" in paths


def test_an_anonymous_client_earns_no_account(tmp_path) -> None:
    with running(digits_job(stop=OPEN_ENDED)) as (bg, _, rec):
        with clients(bg.url, ["ghost"], "--cache-dir", str(tmp_path), "--anonymous") as procs:
            assert rec.wait_for(lambda: len(rec.of(ev.ResultAccepted)) >= 2, HANG_GUARD_S)
            procs["ghost"].send_signal(signal.SIGINT)
            assert procs["ghost"].wait(30) == 0
        assert _get(f"{bg.http}/api/credit")["total"] == 0
        assert not (tmp_path / "volunteer.key").exists()
