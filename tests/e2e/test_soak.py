"""A short soak over real sockets: nothing acknowledged is lost, every kill recovers.

Three real ``crowdgrad client`` processes train with a real ``crowdgrad
coordinator --store`` through the fault proxy (latency, jitter, drops, resets,
a partition) for 75 s while the coordinator is kill -9ed twice and clients are
kill -9ed and restarted (testkit/soak.py; the long run is benchmarks/soak.py).
Every ack the proxy read from a coordinator is checked against what its restart
restores. The schedule is seeded, so the faults asserted below do happen; the
only times are hang guards. No skip: CROWDGRAD_REQUIRE_ALL has nothing to turn
into a failure, the test runs in ``make test``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.faultproxy import FaultPlan
from testkit.soak import SoakConfig, run_soak

FAULTS = FaultPlan(
    latency_s=(0.005, 0.05),
    jitter_s=0.02,
    drop_after_s=20.0,
    reset_after_s=30.0,
    blackhole_after_s=90.0,
    partition_every_s=25.0,
    partition_s=(2.0, 4.0),
)

SHORT = SoakConfig(
    duration_s=75.0,
    clients=3,
    seed=34,
    faults=FAULTS,
    coordinator_kill_every_s=(25.0, 35.0),  # two kills within 75 s, whatever the seed
    client_kill_every_s=30.0,
    client_down_s=(0.5, 3.0),
    rss_every_s=1.0,
    rejoin_deadline_s=150.0,  # a hang guard: the client's backoff is capped at 30 s
    coordinator_args=("--widths", "64,64,10", "--checkpoint-every", "7"),
    client_args=("--flops", "1e9", "--cpu-share", "0.5", "--priority", "normal"),
)


def test_a_short_soak_loses_no_acknowledged_result_and_recovers_from_every_kill(
    tmp_path: Path,
) -> None:
    report = run_soak(SHORT, tmp_path)
    d = report.to_json()
    table = report.table()
    # what the soak did: not vacuous
    assert d["recovery"]["kills"] == 2, table
    assert d["clients_killed"] >= 1, table
    counts = d["faults"]["counts"]
    assert counts["drop"] >= 1 and counts["reset"] >= 1 and counts["partition"] >= 1, table
    assert d["acks"]["checked"] >= 100, table
    assert len(d["kills"]) == 3  # two in the run, one at the end: each checked the store
    # what it must show
    assert d["acks"]["lost"] == 0, d["acks"]["lost_ids"]
    assert d["recovery"]["recovered"] == 2, d["recovery"]["rows"]
    assert d["not_back"] == [], (d["not_back"], d["settle"])
    assert all(not k["corrupt"] for k in d["kills"]), d["kills"]
    assert d["model"]["improving"], d["model"]
    assert report.ok, table


@pytest.mark.slow
def test_the_soak_finds_acks_a_coordinator_gave_before_they_were_durable(tmp_path: Path) -> None:
    """The same soak against a coordinator that acks before the commit: losses found."""
    args = (*SHORT.coordinator_args, "--no-ack-durable")
    cfg = SoakConfig(**{**_fields(SHORT), "duration_s": 45.0, "coordinator_args": args,
                        "coordinator_kill_every_s": (10.0, 15.0)})  # fmt: skip
    report = run_soak(cfg, tmp_path)
    assert report.to_json()["acks"]["lost"] > 0, report.table()
    assert not report.ok


def _fields(cfg: SoakConfig) -> dict[str, object]:
    return {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}
