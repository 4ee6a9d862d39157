"""The round-trip histogram's memory of leases in flight (issue 34): a lease is
forgotten when it ends, with its result, expiry, decline or client, so strangers who
take a task and leave do not pile up until the backstop (``MAX_LEASES_IN_FLIGHT``);
and the one label a client's free text reached (a decline's reason) is a closed set."""

from __future__ import annotations

from coordinator.core import events as ev
from coordinator.http.metrics import Metrics


def _leased(client: str, task: int, now: float, queued: bool = False) -> ev.TaskLeased:
    return ev.TaskLeased(
        client_id=client, task_id=task, lease_id=task, version=0, shard=0,
        deadline=now + 60.0, now=now, queued=queued,
    )  # fmt: skip


def _round_trips(metrics: Metrics) -> tuple[float, float]:
    """(count, sum) of the round-trip histogram."""
    samples = {s.name: s.value for s in next(iter(metrics.round_trip.collect())).samples}
    return samples["crowdgrad_task_round_trip_seconds_count"], samples[
        "crowdgrad_task_round_trip_seconds_sum"
    ]


def test_leases_of_clients_that_left_are_forgotten() -> None:
    metrics = Metrics()
    for i in range(5_000):  # strangers: hello, a task (and a prefetch), gone
        cid = f"c{i}"
        metrics([
            ev.ClientJoined(client_id=cid, name="fuzz", resumed=False, now=float(i)),
            _leased(cid, 2 * i, float(i)),
            _leased(cid, 2 * i + 1, float(i), queued=True),
            ev.ClientLeft(client_id=cid, reason="closed: 1007", now=float(i)),
        ])  # fmt: skip
    assert metrics._leased_at == {}
    assert metrics._leased_to == {}


def test_expired_and_declined_leases_are_forgotten_and_results_still_timed() -> None:
    metrics = Metrics()
    metrics([
        _leased("a", 1, 10.0), _leased("a", 2, 10.0, queued=True), _leased("b", 3, 10.0),
        ev.LeaseExpired(client_id="a", task_id=1, lease_id=1, reissued=True, now=20.0),
        ev.TaskDeclined(client_id="b", task_id=3, lease_id=3, reason="busy", reissued=True,
                        now=11.0),
        _leased("c", 1, 20.0),  # task 1 again, to another client
        ev.ClientLeft(client_id="a", reason="bye", now=21.0),  # c's lease of task 1 stays
        ev.ResultAccepted(client_id="c", task_id=1, staleness=0, version=1, now=25.0),
    ])  # fmt: skip
    assert metrics._leased_at == {}
    assert _round_trips(metrics) == (1.0, 5.0)


def test_a_long_lived_client_keeps_a_few_task_ids() -> None:
    metrics = Metrics()
    for t in range(1_000):
        metrics([
            _leased("honest", t, float(t)),
            ev.ResultAccepted(client_id="honest", task_id=t, staleness=0, version=t,
                              now=t + 0.5),
        ])  # fmt: skip
    assert len(metrics._leased_to["honest"]) <= 9
    assert _round_trips(metrics) == (1_000.0, 500.0)


def test_decline_reasons_are_a_closed_label_set() -> None:
    """A stranger's decline reason is free text: one series per word it made up
    would grow for the process's life."""
    metrics = Metrics()
    reasons = ["compute: ValueError: x", "model", "", "diverged: the update is not finite"]
    reasons += [f"word{i}" for i in range(1_000)]
    for i, reason in enumerate(reasons):
        metrics([
            ev.TaskDeclined(client_id=f"c{i}", task_id=i, lease_id=i, reason=reason,
                            reissued=False, now=0.0),
        ])  # fmt: skip
    counts = {
        s.labels["reason"]: s.value
        for s in next(iter(metrics.declined.collect())).samples
        if s.name.endswith("_total")
    }
    assert counts == {"compute": 1.0, "model": 1.0, "none": 1.0, "diverged": 1.0, "other": 1_000.0}
