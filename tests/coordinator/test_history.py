"""coordinator.runtime.history: the series, their bound, and their trip through a checkpoint."""

from __future__ import annotations

import httpx

from coordinator.core import events as ev
from coordinator.runtime.history import History
from tests.e2e.e2e_helpers import HANG_GUARD_S, clients, digits_job, running


def evaluated(version: int, acc: float) -> ev.Evaluated:
    return ev.Evaluated(version=version, loss=1.0 - acc, accuracy=acc, n=100, now=0.0)


def test_evaluations_and_throughput_rates() -> None:
    h = History(every_s=5.0)
    h.observe([evaluated(5, 0.5), ev.ModelUpdated(version=5, contributions=5, now=0.0)], 100.0)
    assert h.due(0.0)
    h.sample(100.0, version=5, accepted=10, rejected=0, clients=2, bytes_in=1, bytes_out=2)
    assert not h.due(104.9) and h.due(105.0)
    h.sample(105.0, version=9, accepted=30, rejected=1, clients=2, bytes_in=3, bytes_out=4)
    got = h.to_json()
    assert got["evaluations"]["rows"] == [[100.0, 5, 0.5, 0.5]]
    rates = [
        r[got["throughput"]["fields"].index("results_per_s")] for r in got["throughput"]["rows"]
    ]
    assert rates == [0.0, 4.0]  # 20 results in 5 s
    assert h.to_json(since=100.0)["throughput"]["rows"][0][0] == 105.0


def test_a_long_run_is_thinned_not_cut() -> None:
    h = History(max_points=16)
    for v in range(1000):
        h.observe([evaluated(v, v / 1000)], float(v))
    rows = h.evaluations
    assert len(rows) <= 16
    assert rows[0][1] == 0 and rows[-1][1] == 999  # the first and the newest point stay
    assert [r[1] for r in rows] == sorted(r[1] for r in rows)


def test_load_takes_saved_series_and_ignores_foreign_ones() -> None:
    a = History()
    a.observe([evaluated(3, 0.7)], 10.0)
    a.sample(10.0, version=3, accepted=3, rejected=0, clients=1, bytes_in=0, bytes_out=0)
    b = History()
    b.load(a.to_json())
    assert b.to_json() == a.to_json()
    c = History()
    c.load({"evaluations": {"fields": ["x"], "rows": [[1]]}, "throughput": "nope"})
    c.load(None)
    rows = [[1, 2, float("nan"), 0], [1, 2, 0.5, 0.5], "bad"]
    c.load({"evaluations": {"fields": ["t", "version", "accuracy", "loss"], "rows": rows}})
    assert c.evaluations == [[1.0, 2.0, 0.5, 0.5]] and c.throughput == []


def test_history_survives_a_restart_from_the_store(tmp_path) -> None:
    job = digits_job(stop={"target_accuracy": 0.9})
    store = tmp_path / "h.db"
    with running(job, store=store) as (bg, service, rec):
        base = bg.url.replace("ws://", "http://").removesuffix("/ws")
        with clients(bg.url, ["h1", "h2"]):
            assert rec.wait_for(lambda: bool(rec.of(ev.JobFinished)), timeout=HANG_GUARD_S)
        first = httpx.get(f"{base}/api/history", timeout=10).json()
    evals = rec.of(ev.Evaluated)
    assert [r[1] for r in first["evaluations"]["rows"]] == [e.version for e in evals]
    assert first["throughput"]["rows"], "sampled while it ran"
    with running(job, store=store) as (bg, service, _rec):
        base = bg.url.replace("ws://", "http://").removesuffix("/ws")
        again = httpx.get(f"{base}/api/history", timeout=10).json()
        assert service.stats.restored_from is not None
    # everything up to the last checkpoint came back
    saved = [r for r in first["evaluations"]["rows"] if r[1] <= service.stats.restored_from]
    assert saved and again["evaluations"]["rows"][: len(saved)] == saved
