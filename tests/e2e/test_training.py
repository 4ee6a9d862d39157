"""A real coordinator (uvicorn, loopback) and real client subprocesses train digits to 0.95."""

from __future__ import annotations

import pytest

from coordinator.core import events as ev
from coordinator.core.machine import Coordinator
from tests.e2e.e2e_helpers import (
    HANG_GUARD_S,
    SETTINGS,
    clients,
    digits_job,
    running,
    train_together,
)


@pytest.mark.parametrize("strategy", list(SETTINGS))
def test_four_clients_reach_95_percent(strategy: str) -> None:
    job = digits_job(strategy, lease={"prefetch": True})  # off by default: its path runs here
    with running(job) as (bg, service, rec):
        names = [f"w{i}" for i in range(4)]
        codes = train_together(bg.url, service, rec, names)
    fin = service.stats.finished
    assert fin is not None and fin["reason"] == "target_accuracy", fin
    assert fin["accuracy"] >= 0.95
    assert codes == dict.fromkeys(names, 0)  # every client got bye and exited cleanly
    joined = {o.client_id: o.name for o in rec.of(ev.ClientJoined)}
    contributors = {joined[o.client_id] for o in rec.of(ev.ResultAccepted)}
    assert contributors == set(names)
    # the desktop clients ask for their next task while they compute (prefetch);
    # where the job offers it, only decentral-async leases one behind the running task
    queued = [o for o in rec.of(ev.TaskLeased) if o.queued]
    assert bool(queued) == (strategy == "decentral-async"), len(queued)
    assert service.stats.tasks_prefetched == len(queued)  # shown in /api/status


def test_churn_kill_two_start_one() -> None:
    """kill -9 two clients holding leases; a newcomer joins; the job still finishes,
    the dead clients' round tasks are leased again (a sync round needs them; an async
    strategy requeues the shard instead) and no lease is left live."""
    # short round deadline and resume grace: a round never waits long for the dead
    job = digits_job(
        "decentral-sync", strategy={"round_deadline_s": 5.0}, lease={"resume_grace_s": 5.0}
    )
    with running(job) as (bg, service, rec):
        names = [f"w{i}" for i in range(6)]
        with clients(bg.url, names) as procs:

            def holders() -> dict[str, int]:
                """name -> task id of every client holding a live lease right now."""
                names_of = {o.client_id: o.name for o in rec.of(ev.ClientJoined)}

                def look(core: Coordinator) -> dict[str, int]:
                    return {
                        names_of[lease.client_id]: lease.task_id
                        for lease in core.book.leases_live()
                        if lease.client_id in names_of
                    }

                return service.call(look).result(10)

            assert rec.wait_for(lambda: len(holders()) >= 2, 60)
            held = holders()
            killed = sorted(held)[:2]
            live = {n: held[n] for n in killed}
            for n in killed:
                procs[n].kill()
            with clients(bg.url, ["late"]) as late:
                assert service.done.wait(HANG_GUARD_S), service.stats
                assert late["late"].wait(30) == 0
            survivors = {n: procs[n].wait(30) for n in names if n not in killed}
        stuck = service.call(lambda core: list(core.book.leases_live())).result(10)
    assert service.stats.finished["reason"] == "target_accuracy"
    assert set(survivors.values()) == {0}
    cid = {o.name: o.client_id for o in rec.of(ev.ClientJoined)}
    assert {cid[n] for n in killed} <= {o.client_id for o in rec.of(ev.ClientLeft)}
    # every task a victim held when killed was leased again to somebody else, unless
    # its result had already arrived between our look and the kill
    for name, task_id in live.items():
        again = [
            o for o in rec.of(ev.TaskLeased) if o.task_id == task_id and o.client_id != cid[name]
        ]
        done = [o for o in rec.of(ev.ResultAccepted) if o.task_id == task_id]
        assert again or done, f"task {task_id} of killed {name} was never reissued"
    assert any(o.name == "late" for o in rec.of(ev.ClientJoined))
    assert stuck == []


def test_desktop_clients_train_through_sub_model_tasks() -> None:
    """Real client processes get subnets (§3.3.1) of half the hidden neurons: each
    download is the slice, and the whole model still learns digits."""
    job = digits_job(submodel={"mode": "random", "fraction": 0.5}, stop={"target_accuracy": 0.9})
    with running(job) as (bg, service, rec), clients(bg.url, ["s0", "s1"]) as procs:
        assert service.done.wait(HANG_GUARD_S), service.stats
        codes = {n: p.wait(30) for n, p in procs.items()}
    fin = service.stats.finished
    assert fin is not None and fin["reason"] == "target_accuracy", fin
    assert codes == {"s0": 0, "s1": 0}
    leased = rec.of(ev.TaskLeased)
    assert leased and all(o.download == "full" for o in leased)
    assert max(o.download_bytes for o in leased) < 0.6 * job.spec.nbytes
    assert rec.of(ev.ResultAccepted)
