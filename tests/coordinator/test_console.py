"""The coordinator's console: every kind of event said, floods counted, not printed."""

from __future__ import annotations

from coordinator.core import events as ev
from coordinator.http.console import ConsoleLog


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make(burst: int = 3, interval: float = 10.0) -> tuple[ConsoleLog, list[str], Clock]:
    lines: list[str] = []
    clock = Clock()
    return ConsoleLog(lines.append, interval=interval, burst=burst, clock=clock), lines, clock


def test_a_small_job_is_told_event_by_event() -> None:
    log, lines, _ = make()
    log([ev.ClientJoined(client_id="c1", name="alice", resumed=False, now=0)])
    log([ev.ResultAccepted(client_id="c1", task_id=1, staleness=0, version=0, now=0)])
    log([ev.ResultRejected(client_id="c1", task_id=2, reason="norm", now=0)])
    log([ev.ResultRejected(client_id="c1", task_id=1, reason="duplicate", now=0)])
    log([ev.Evaluated(version=10, loss=0.5, accuracy=0.9, n=100, now=0)])
    log([ev.Checkpoint(version=10), ev.Checkpoint(version=10)])
    log([ev.ClientLeft(client_id="c1", reason="bye", now=0)])
    log([ev.JobFinished(version=10, reason="target_accuracy", accuracy=0.95, now=0)])
    assert lines == [
        "alice joined; 1 connected",
        "first result accepted, from alice",
        "rejected a result from alice: norm",
        "a result alice sent again was taken already (duplicate)",
        "model v10: test accuracy 0.9000, loss 0.5000",
        "checkpoint of model v10",
        "alice left (bye); 0 connected",
        "job finished (target_accuracy) at model v10, test accuracy 0.9500",
    ]


def test_seven_hundred_joins_and_a_reject_storm_print_a_handful_of_lines() -> None:
    log, lines, clock = make(burst=3)
    log(
        [ev.ClientJoined(client_id=f"c{i}", name=f"p{i}", resumed=False, now=0) for i in range(700)]
    )
    log([ev.ResultRejected(client_id="c1", task_id=i, reason="stale", now=0) for i in range(50)])
    log([ev.ResultRejected(client_id="c2", task_id=i, reason="norm", now=0) for i in range(9)])
    log([ev.ModelUpdated(version=12, contributions=1, now=0)])
    log([ev.ResultAccepted(client_id="c1", task_id=99, staleness=0, version=1, now=0)] * 40)
    assert len(lines) == 3 + 3 + 1  # joins, rejections, the first result
    clock.t = 10.0
    log([])
    assert len(lines) == 8
    assert lines[-1] == (
        "697 more joined, 0 more left; 700 connected; "
        "56 more results rejected (stale 47, norm 9); model v12, 700 clients, 3.9 results/s"
    )
    clock.t = 25.0
    log([ev.ClientJoined(client_id="x", name="late", resumed=True, now=0)])
    assert lines[-1] == "late joined again (resumed its session); 701 connected"


def test_an_evaluation_not_said_in_its_window_comes_with_the_summary() -> None:
    log, lines, _ = make(burst=1)
    log([ev.Evaluated(version=v, loss=1.0, accuracy=v / 100, n=10, now=0) for v in (5, 10, 15)])
    assert lines == ["model v5: test accuracy 0.0500, loss 1.0000"]
    log.flush()
    assert lines[-1] == "v15: test accuracy 0.1500"
    log.flush()
    assert len(lines) == 2  # a quiet window says nothing


def test_names_of_clients_that_left_are_forgotten() -> None:
    """Issue 34: every hostile connection joins under a new id and leaves; its name was
    kept for good (an untracked dict of strings, RSS rising over a million fuzz frames)."""
    log, lines, _ = make()
    for i in range(5_000):
        log([
            ev.ClientJoined(client_id=f"c{i}", name=f"fuzz-{i}", resumed=False, now=0),
            ev.ClientLeft(client_id=f"c{i}", reason="closed: 1007", now=0),
        ])  # fmt: skip
    assert log._names == {} and log._connected == set()
    assert lines[:2] == ["fuzz-0 joined; 1 connected", "fuzz-0 left (closed: 1007); 0 connected"]
