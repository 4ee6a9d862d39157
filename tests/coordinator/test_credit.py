"""Credit, BOINC-style: accepted work counted in FLOPs the server sized, per
volunteer across sessions; with replication, only once checked, and a proven
liar forfeits what was pending."""

from __future__ import annotations

import dataclasses

import pytest

from client.compute import ComputeOutput
from client.session import Capabilities
from coordinator.core import events as ev
from coordinator.core.assembly import build_core, restore_core
from coordinator.core.credit import CreditBook
from protocol import messages as m
from protocol.volunteer import check_key, check_name, volunteer_id
from testkit.loopback import Loopback
from tests.coordinator.coord_helpers import digits, hello, make_job, only, sent

KEYS = [f"volunteer-key-{i:04d}-abcdef" for i in range(6)]
ON = {"enabled": True, "base_rate": 1.0, "trust_after": 3}


def _crowd(n: int = 3, *, replication: dict | None = None, keys: bool = True):
    job = make_job(
        replication=replication or {},
        stop={"max_versions": 100_000, "patience": 0},
        eval={"every_versions": 100_000},
    )
    core = build_core(job, seed=2, dataset=digits())
    lb = Loopback(core)
    for i in range(n):
        caps = Capabilities(flops=1e9 * (1 + 0.3 * i), volunteer=KEYS[i] if keys else None)
        lb.add_client(f"c{i}", caps=caps)
    return core, lb


def _work(outputs: list[ev.Output], client: str) -> float:
    """The FLOPs of the client's accepted results, from the task messages it was
    sent: the trained spec's FLOPs per sample × steps × batch."""
    tasks = {
        int(o.message.task_id): o.message
        for o in outputs
        if isinstance(o, ev.Send) and isinstance(o.message, m.Task)
    }
    return sum(
        tasks[o.task_id].spec.flops_per_sample() * tasks[o.task_id].steps * tasks[o.task_id].batch
        for o in outputs
        if isinstance(o, ev.ResultAccepted) and o.client_id == client
    )


def test_keys_and_names_are_checked_and_the_id_hides_the_key() -> None:
    assert check_key("short") is not None and check_key("x" * 129) is not None
    assert check_key("a" * 16) is None and check_key("has space in it!!") is not None
    assert check_name("Ada") is None and check_name("   ") is not None
    assert check_name("x" * 33) is not None
    assert check_name("evil\u202eman") is not None  # a bidi override
    assert check_name("tab\there") is not None
    vid = volunteer_id(KEYS[0])
    assert len(vid) == 16 and KEYS[0] not in vid and vid == volunteer_id(KEYS[0])


def test_a_bad_key_or_name_is_refused_naming_the_field() -> None:
    core = build_core(make_job(), dataset=digits())
    out = core.connect("a", hello("alice", volunteer="short"), 0.0)
    err = [x for x in sent(out, "a") if isinstance(x, m.Error)]
    assert err and err[0].message.startswith("hello.volunteer:")
    out = core.connect("b", hello("evil\u202eman", volunteer=KEYS[0]), 0.0)
    err = [x for x in sent(out, "b") if isinstance(x, m.Error)]
    assert err and err[0].message.startswith("hello.client:")


def test_without_replication_credit_is_the_flops_of_accepted_results() -> None:
    core, lb = _crowd()
    lb.run(until=0.3)
    welcomes = [
        x for x in lb.outputs if isinstance(x, ev.Send) and isinstance(x.message, m.Welcome)
    ]
    assert {w.message.volunteer for w in welcomes} == {volunteer_id(k) for k in KEYS[:3]}
    for i in range(3):
        acct = core.credit.one(volunteer_id(KEYS[i]))
        assert acct is not None
        want = _work(lb.outputs, f"c{i}")
        assert want > 0 and acct["flops"] == pytest.approx(want, rel=1e-12)
        assert acct["pending_flops"] == 0 and acct["results"] > 0
    total, rows = core.credit.page(0, 10)
    assert total == 3 and [r["rank"] for r in rows] == [1, 2, 3]
    assert rows[0]["flops"] >= rows[1]["flops"] >= rows[2]["flops"]


def test_anonymous_clients_earn_nothing_and_a_key_keeps_credit_across_sessions() -> None:
    core, lb = _crowd(2, keys=False)
    lb.run(until=0.1)
    assert core.credit.accounts == {}
    core = build_core(make_job(), dataset=digits())
    core.connect("a", hello("ada", volunteer=KEYS[5]), 0.0)
    core.credit.accepted("a", 1, 100.0, replicated=False)
    core.disconnect("a", 1.0)
    core.connect("b", hello("ada again", volunteer=KEYS[5]), 2.0)
    core.credit.accepted("b", 2, 50.0, replicated=False)
    acct = core.credit.one(volunteer_id(KEYS[5]))
    assert acct is not None and acct["flops"] == 150.0 and acct["name"] == "ada again"


def test_credit_survives_a_checkpoint() -> None:
    core, lb = _crowd()
    lb.run(until=0.2)
    before = {v: core.credit.one(v) for v in core.credit.accounts}
    again = restore_core(core.job, core.state_dict(), dataset=digits())
    assert {v: again.credit.one(v) for v in again.credit.accounts} == before


def test_with_replication_credit_waits_for_a_check_and_a_liar_ends_with_none() -> None:
    core, lb = _crowd(4, replication=ON)

    def lie(out: ComputeOutput) -> ComputeOutput:
        return dataclasses.replace(out, update=-out.update)

    lb.lies["c3"] = lie
    lb.run(until=0.5)
    assert [x.client_id for x in only(lb.outputs, ev.ClientExcluded)] == ["c3"]
    liar = core.credit.one(volunteer_id(KEYS[3]))
    assert liar is not None and liar["flops"] == 0 and liar["pending_flops"] == 0
    assert liar["forfeited"] > 0
    granted = 0.0
    for i in range(3):
        acct = core.credit.one(volunteer_id(KEYS[i]))
        assert acct is not None and acct["flops"] > 0
        # granted and pending never exceed the work accepted from it
        assert acct["flops"] + acct["pending_flops"] <= _work(lb.outputs, f"c{i}") * (1 + 1e-9)
        granted += acct["flops"]
    assert core.credit.total() == pytest.approx(granted)


def test_a_verdict_grants_the_right_copy_vouches_for_unchecked_and_a_lie_forfeits() -> None:
    book = CreditBook(verified_only=True)
    a, b = volunteer_id(KEYS[0]), volunteer_id(KEYS[1])
    book.join("c1", KEYS[0], "a", 0.0)
    book.join("c2", KEYS[1], "b", 0.0)
    book.accepted("c1", 10, 5.0, replicated=False)  # unchecked
    book.accepted("c1", 11, 7.0, replicated=True)
    book.accepted("c2", 12, 7.0, replicated=True)
    assert book.one(a)["pending_flops"] == 12.0 and book.one(a)["flops"] == 0
    book.observe(
        ev.ResultVerified(task_id=11, twin_id=12, client_ids=("c1", "c2"), agreed=False,
                          now=1.0, losers=("c2",))
    )  # fmt: skip
    assert book.one(a)["flops"] == 12.0 and book.one(a)["results"] == 2
    assert book.one(a)["pending_flops"] == 0
    assert book.one(b)["flops"] == 0 and book.one(b)["forfeited"] == 1
    book.accepted("c2", 13, 3.0, replicated=True)  # two copies that lie alike agree
    book.accepted("c1", 14, 3.0, replicated=True)
    book.observe(
        ev.ResultVerified(task_id=13, twin_id=14, client_ids=("c2", "c1"), agreed=True, now=2.0)
    )
    assert book.one(b)["flops"] == 3.0
    book.accepted("c2", 15, 3.0, replicated=False)
    book.observe(ev.ClientExcluded(client_id="c2", task_id=15, unverified=1, reverted=0, now=3))
    acct = book.one(b)
    assert acct["flops"] == 0 and acct["pending_flops"] == 0 and acct["excluded"]
    assert acct["forfeited"] == 3 and acct["results"] == 0
    book.accepted("c2", 16, 3.0, replicated=False)  # nothing more under that key
    assert book.one(b)["pending_flops"] == 0
    again = CreditBook(verified_only=True)
    again.load_state_dict(book.state_dict())
    assert again.one(a) == book.one(a) and again.one(b) == book.one(b)


def test_an_inconclusive_copy_earns_nothing_and_vouches_for_nothing() -> None:
    """Replication could not judge it (another kernel family, off the coordinator's
    run): not granted, and the volunteer's unchecked results stay pending."""
    book = CreditBook(verified_only=True)
    vid = book.join("a", KEYS[0], "Ada", 0.0)
    book.join("b", KEYS[1], "Bob", 0.0)
    book.accepted("a", 1, 10.0, replicated=False)  # unchecked
    book.accepted("a", 2, 5.0, replicated=True)
    book.accepted("b", 3, 5.0, replicated=True)
    verdict = ev.ResultVerified(
        task_id=3, twin_id=2, client_ids=("b", "a"), agreed=False, now=1.0, inconclusive=("a",)
    )
    book.observe(verdict)
    acct = book.accounts[vid]
    assert (acct.flops, acct.results, acct.pending) == (0.0, 0, 10.0)
    assert book.accounts[volunteer_id(KEYS[1])].flops == 5.0
