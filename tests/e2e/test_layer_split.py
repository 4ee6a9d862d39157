"""A layer-split job over real websockets: two desktop client processes train the
two blocks of a cut network to 0.95 on digits (docs/protocol.md §3.3.2), each
lower result carrying its boundary up and each upper task fetching it down."""

from __future__ import annotations

from coordinator.core import events as ev
from tests.e2e.e2e_helpers import digits_job, running, train_together


def test_two_clients_train_the_two_blocks_of_a_cut_network_to_95_percent() -> None:
    job = digits_job(
        "decentral-async",
        model={"widths": [64, 64, 32, 10]},
        strategy={"window": 1},
        split={"cut": 1},
        eval={"every_versions": 10},
    )
    with running(job) as (bg, service, rec):
        names = ["lower-or-upper-0", "lower-or-upper-1"]
        codes = train_together(bg.url, service, rec, names)
    fin = service.stats.finished
    assert fin is not None and fin["reason"] == "target_accuracy", fin
    assert fin["accuracy"] >= 0.95
    assert codes == dict.fromkeys(names, 0)
    # upper tasks fetched the boundary shards the lower results made (§13)
    served = rec.of(ev.DataServed)
    job_shards = 8
    assert len({d.sha256 for d in served}) > job_shards
    assert not rec.of(ev.ResultRejected)
    split = service.stats.split  # /api/status -> split
    assert split is not None and split["cut"] == 1
    assert split["lower_steps"] > 0 and split["upper_steps"] > 0
    assert split["lower_steps"] + split["upper_steps"] == fin["version"]
