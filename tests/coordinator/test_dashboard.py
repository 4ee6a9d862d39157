"""coordinator.http.dashboard: client rows from events, bounded events, evaluations
thinned in the events, time-left guesses."""

from __future__ import annotations

import itertools

from coordinator.core import events as ev
from coordinator.http.dashboard import EVAL_GAP_S, MAX_GONE, Dashboard, estimate_left


def test_rows_follow_the_events() -> None:
    d = Dashboard(clock=lambda: 50.0)
    d([ev.ClientJoined(client_id="c1", name="crowdgrad-web/0.1", resumed=False, now=0.0),
       ev.TaskLeased(client_id="c1", task_id=1, lease_id=1, version=0, shard=0, deadline=9.0,
                     now=0.0, download_bytes=1000),
       ev.DataServed(client_id="c1", sha256="0" * 64, nbytes=4000, frame_bytes=4100, now=0.5),
       ev.ResultAccepted(client_id="c1", task_id=1, staleness=2, version=1, now=1.0,
                         frame_bytes=300),
       ev.ResultRejected(client_id="c1", task_id=2, reason="norm", now=2.0),
       ev.ResultRejected(client_id="c1", task_id=1, reason="duplicate", now=2.5),
       ev.LeaseExpired(client_id="c1", task_id=3, lease_id=3, reissued=True, now=3.0)])  # fmt: skip
    snap = d.snapshot(lambda cid: 1e9)
    (row,) = snap["clients"]
    assert row["kind"] == "browser" and row["flops"] == 1e9
    # the resend is counted as such, not as a refusal of the client's work
    assert (row["tasks"], row["accepted"], row["rejected"], row["resent"], row["expired"]) == (
        1,
        1,
        {"norm": 1},
        1,
        1,
    )
    # the shard's frames count too: the volunteer's link carried them
    assert (row["bytes_down"], row["bytes_up"], row["mean_staleness"]) == (5100, 300, 2.0)
    kinds = [e["kind"] for e in snap["events"]]
    # a resend after a reconnect is told apart from a refusal (not shown as one)
    assert kinds == ["join", "rejected", "duplicate", "expired"]
    assert "taken already" in snap["events"][2]["text"]
    assert d.snapshot(lambda cid: None, since_event=snap["events"][-1]["id"])["events"] == []
    d([ev.ClientLeft(client_id="c1", reason="bye: client stopping", now=4.0)])
    assert d.snapshot(lambda cid: None)["clients"][0]["connected"] is False


def test_a_tab_with_a_display_name_is_a_browser_by_its_platform() -> None:
    """A tab that sends a volunteer key gives its display name as hello.client; its
    hello.platform still starts with the web client's name, so its row says browser."""
    d = Dashboard(clock=lambda: 0.0)
    d([ev.ClientJoined(client_id="c1", name="tab-1a2b", resumed=False, now=0.0,
                       platform="crowdgrad-web/0.1 (Mozilla/5.0)"),
       ev.ClientJoined(client_id="c2", name="ada", resumed=False, now=0.0,
                       platform="Linux-6.1-x86_64")])  # fmt: skip
    kinds = {r["client_id"]: r["kind"] for r in d.snapshot(lambda cid: None)["clients"]}
    assert kinds == {"c1": "browser", "c2": "other"}


def test_a_row_says_what_the_client_costs_its_link_an_hour() -> None:
    """Both directions' bytes per hour connected (its shard's frames included),
    from the first minute on (before it a few tasks' bytes say little), and
    frozen once the client left."""
    now = [0.0]  # the rows' times are the dashboard's clock
    d = Dashboard(clock=lambda: now[0])
    d([ev.ClientJoined(client_id="c1", name="x", resumed=False, now=0.0),
       ev.TaskLeased(client_id="c1", task_id=1, lease_id=1, version=0, shard=0, deadline=9.0,
                     now=0.0, download_bytes=1000),
       ev.DataServed(client_id="c1", sha256="0" * 64, nbytes=4000, frame_bytes=4100, now=0.5),
       ev.ResultAccepted(client_id="c1", task_id=1, staleness=0, version=1, now=1.0,
                         frame_bytes=500)])  # fmt: skip
    now[0] = 30.0
    assert d.snapshot(lambda cid: None)["clients"][0]["bytes_per_hour"] is None
    now[0] = 1800.0
    assert d.snapshot(lambda cid: None)["clients"][0]["bytes_per_hour"] == 11200.0
    now[0] = 900.0
    d([ev.ClientLeft(client_id="c1", reason="gone", now=900.0)])
    now[0] = 7200.0
    assert d.snapshot(lambda cid: None)["clients"][0]["bytes_per_hour"] == 22400.0


def test_rows_of_clients_that_left_are_bounded() -> None:
    d = Dashboard()
    for i in range(MAX_GONE + 50):
        cid = f"c{i}"
        d([ev.ClientJoined(client_id=cid, name="x", resumed=False, now=0.0),
           ev.ClientLeft(client_id=cid, reason="gone", now=1.0)])  # fmt: skip
    assert len(d.rows) == MAX_GONE
    assert next(iter(d.rows)) == "c50"  # the oldest went first


def evaluated(version: int, accuracy: float) -> ev.Evaluated:
    return ev.Evaluated(version=version, loss=1.0 - accuracy, accuracy=accuracy, n=360, now=0.0)


def test_evaluations_are_lines_only_when_accuracy_moved_and_never_flood() -> None:
    """A minute of 18 evaluations a second, accuracy climbing with noise, among
    joins, a leave, a rejection, a checkpoint and the end: every one of those is a
    line; the evaluations are the first one and at most one per EVAL_GAP_S, each
    saying how many it stands for and how far accuracy moved."""
    now = [0.0]
    d = Dashboard(clock=lambda: now[0])
    d([ev.ClientJoined(client_id=f"c{i}", name="x", resumed=False, now=0.0) for i in range(3)])
    n = 18 * 60
    for i in range(n):
        now[0] = i / 18
        noise = 0.02 * ((i * 7919) % 13 - 6) / 6  # ±2 points, deterministic
        d([evaluated(i + 1, min(0.97, 0.2 + i / n) + noise)])
        if i == n // 2:
            d([ev.ResultRejected(client_id="c1", task_id=9, reason="norm", now=0.0),
               ev.ClientLeft(client_id="c2", reason="gone", now=0.0),
               ev.Checkpoint(version=i)])  # fmt: skip
    d([ev.JobFinished(version=n, reason="target_accuracy", accuracy=0.97, now=0.0)])
    events = d.snapshot(lambda cid: None)["events"]
    kinds = [e["kind"] for e in events]
    assert kinds.count("join") == 3 and kinds.count("leave") == 1
    assert {"rejected", "checkpoint", "finished"} <= set(kinds)
    lines = [e for e in events if e["kind"] == "evaluated"]
    assert 3 <= len(lines) <= 1 + 60 / EVAL_GAP_S, [e["text"] for e in lines]
    assert lines[0]["text"].startswith("v1: accuracy") and "first evaluation" in lines[0]["text"]
    times = [e["t"] for e in lines]
    assert all(b - a >= EVAL_GAP_S for a, b in itertools.pairwise(times))
    assert "evaluations), loss" in lines[1]["text"]
    assert events[-1]["text"] == f"job finished at v{n}: target_accuracy, accuracy 0.9700"


def test_a_flat_run_has_one_evaluation_line_and_a_fall_has_another() -> None:
    now = [0.0]
    d = Dashboard(clock=lambda: now[0])
    for i in range(1000):
        now[0] = float(i)
        d([evaluated(i, 0.9 + (0.004 if i % 2 else -0.004))])
    assert [e["kind"] for e in d.snapshot(lambda cid: None)["events"]] == ["evaluated"]
    now[0] += 1
    d([evaluated(1000, 0.6)])  # diverged: 30 points down
    (_, fall) = d.snapshot(lambda cid: None)["events"]
    assert fall["text"] == (
        "v1000: accuracy 0.6000 (-0.2960 since v0, 1000 evaluations), loss 0.4000"
    )


def test_time_left_takes_the_first_bound() -> None:
    base = dict(now=100.0, started=0.0, version=100, evaluations=[])
    by_versions = estimate_left(**base, max_versions=300, max_time_s=1000.0,
                                target_accuracy=None, versions_per_s=2.0)  # fmt: skip
    assert by_versions == {"seconds": 100.0, "by": "max_versions"}
    by_time = estimate_left(**base, max_versions=None, max_time_s=150.0,
                            target_accuracy=None, versions_per_s=2.0)  # fmt: skip
    assert by_time == {"seconds": 50.0, "by": "max_time"}
    evals = [[10.0, 10, 0.5, 1.0], [20.0, 20, 0.6, 0.8], [30.0, 30, 0.7, 0.6]]
    by_acc = estimate_left(now=30.0, started=0.0, version=30, evaluations=evals,
                           max_versions=None, max_time_s=None, target_accuracy=0.9,
                           versions_per_s=1.0)  # fmt: skip
    assert by_acc["by"] == "target_accuracy" and abs(by_acc["seconds"] - 20.0) < 1e-6
    flat = estimate_left(now=30.0, started=0.0, version=30, evaluations=evals[:1] * 3,
                         max_versions=None, max_time_s=None, target_accuracy=0.9,
                         versions_per_s=0.0)  # fmt: skip
    assert flat == {"seconds": None, "by": None}


def test_status_counts_a_resend_apart_from_refusals() -> None:
    """/api/status's counters (runtime.stats): a result resent after a reconnect and
    taken already is ``resent``, not a refusal of the client's work."""
    from coordinator.runtime.stats import Stats

    st = Stats()
    st.count(
        [
            ev.ResultRejected(client_id="c1", task_id=2, reason="norm", now=2.0),
            ev.ResultRejected(client_id="c1", task_id=1, reason="duplicate", now=2.5),
            ev.ResultRejected(client_id="c1", task_id=1, reason="duplicate", now=2.6),
        ]
    )
    assert (st.rejected, st.resent) == (1, 2)
