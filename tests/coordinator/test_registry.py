import pytest

from coordinator.core.registry import Registry


def test_resume_ids_are_seeded_and_resume_restores_record() -> None:
    r1, r2 = Registry(7), Registry(7)
    a, resumed = r1.join("x", name="a", flops=1e9, resume_id=None, now=0.0)
    assert (
        not resumed
        and a.resume_id == r2.join("y", name="a", flops=1, resume_id=None, now=0)[0].resume_id
    )
    assert (
        Registry(8).join("x", name="a", flops=1, resume_id=None, now=0)[0].resume_id != a.resume_id
    )
    a.rejections, a.version_sent = 2, 0  # it was given a task
    # a live record cannot be taken over by a second connection
    b, resumed = r1.join("z", name="b", flops=1e9, resume_id=a.resume_id, now=1.0)
    assert not resumed and b.resume_id != a.resume_id
    r1.leave("x", 1.5)
    again, resumed = r1.join("x2", name="a", flops=1e9, resume_id=a.resume_id, now=2.0)
    assert resumed and again is a and again.rejections == 2 and again.client_id == "x2"
    assert [c.client_id for c in r1.connected()] == ["z", "x2"]
    with pytest.raises(ValueError, match="already connected"):
        r1.join("z", name="b", flops=1, resume_id=None, now=3.0)


def test_speed_estimate() -> None:
    rec = Registry(0).join("x", name="a", flops=1e9, resume_id=None, now=0)[0]
    assert rec.rate() == 1e9
    rec.observe_speed(2e9, 1.0)
    assert rec.rate() == 2e9
    rec.observe_speed(1e9, 1.0)
    assert rec.rate() == pytest.approx(1.7e9)
    rec.observe_speed(1e9, 0.0)  # ignored
    assert rec.rate() == pytest.approx(1.7e9)


def test_records_of_clients_that_left_are_forgotten_in_leave_order() -> None:
    r = Registry(0)
    recs = [r.join(f"c{i}", name="n", flops=1, resume_id=None, now=0.0)[0] for i in range(4)]
    for rec in recs:
        rec.version_sent = 0  # each was given a task
    for t, i in enumerate((2, 0, 3)):  # the core's clock never goes back
        r.leave(f"c{i}", 10.0 + t)
    assert r.known() == 4
    assert r.forget(11.0) == 1  # c2 left at 10 (c0 at 11 is not before 11)
    assert r.known() == 3
    # a resumed client is not forgotten later: it is connected again
    back, resumed = r.join("c3b", name="n", flops=1, resume_id=recs[3].resume_id, now=14.0)
    assert resumed and back is recs[3]
    assert r.forget(1e9) == 1  # only c0; c1 never left, c3 came back
    assert r.known() == 2
    fresh, resumed = r.join("c0b", name="n", flops=1, resume_id=recs[0].resume_id, now=20.0)
    assert not resumed and fresh.resume_id != recs[0].resume_id


def test_a_client_never_given_a_task_leaves_nothing_to_resume() -> None:
    r = Registry(0)
    idle = r.join("x", name="n", flops=1, resume_id=None, now=0.0)[0]
    worked = r.join("y", name="n", flops=1, resume_id=None, now=0.0)[0]
    worked.version_sent = 3
    r.leave("x", 1.0)
    r.leave("y", 1.0)
    assert r.known() == 1
    back, resumed = r.join("x2", name="n", flops=1, resume_id=idle.resume_id, now=2.0)
    assert not resumed and back.resume_id != idle.resume_id
    again, resumed = r.join("y2", name="n", flops=1, resume_id=worked.resume_id, now=2.0)
    assert resumed and again is worked


def test_records_of_clients_that_left_are_capped_first_left_first_forgotten() -> None:
    r = Registry(0, max_left=3)
    recs = [r.join(f"c{i}", name="n", flops=1, resume_id=None, now=0.0)[0] for i in range(6)]
    for rec in recs:
        rec.version_sent = 0
    for i in (4, 0, 1, 2):
        r.leave(f"c{i}", 1.0)  # the time bound is far: only the cap forgets
    assert r.known() == 2 + 3  # c3, c5 connected; c0, c1, c2 kept; c4 left first, forgotten
    assert not r.join("c4b", name="n", flops=1, resume_id=recs[4].resume_id, now=2.0)[1]
    # resuming takes a record out of the queue: c1 is safe while c0 goes next
    assert r.join("c1b", name="n", flops=1, resume_id=recs[1].resume_id, now=2.0)[1]
    r.leave("c3", 3.0)
    r.leave("c5", 3.0)  # c0 makes way (c1 resumed: three were left)
    assert [
        r.join(f"{c}b", name="n", flops=1, resume_id=recs[i].resume_id, now=4.0)[1]
        for i, c in ((0, "c0"), (2, "c2"), (3, "c3"), (5, "c5"))
    ] == [False, True, True, True]
    with pytest.raises(ValueError, match="max_left"):
        Registry(0, max_left=-1)


def test_records_of_clients_with_no_accepted_result_have_their_own_lower_cap() -> None:
    """A flood that takes tasks and vanishes fills only the unproven queue: the
    records of volunteers with accepted results stay resumable."""
    r = Registry(0, max_left=10, max_left_unproven=2)
    proven = [r.join(f"p{i}", name="n", flops=1, resume_id=None, now=0.0)[0] for i in range(3)]
    for rec in proven:
        rec.version_sent, rec.accepted = 0, 5
        r.leave(rec.client_id, 1.0)
    strangers = [r.join(f"s{i}", name="n", flops=1, resume_id=None, now=2.0)[0] for i in range(6)]
    for rec in strangers:
        rec.version_sent = 0
        r.leave(rec.client_id, 3.0)
    assert r.known() == 3 + 2
    back = [r.join(f"{rec.client_id}b", name="n", flops=1, resume_id=rec.resume_id, now=4.0)[1]
            for rec in proven + strangers]  # fmt: skip
    assert back == [True] * 3 + [False] * 4 + [True, True]  # the last two strangers kept
    # the overall cap still holds, and forgetting by time empties both queues
    for rec in proven:
        r.leave(rec.client_id, 5.0)  # p0b, p1b, p2b since they resumed
    assert r.forget(before=6.0) == 3 and r.known() == 2 + 4  # connected: s4b, s5b + 4 fresh
    with pytest.raises(ValueError, match="max_left_unproven"):
        Registry(0, max_left_unproven=-1)


def test_a_record_remembers_its_latest_shards_newest_first() -> None:
    from coordinator.core.registry import HELD_SHARDS

    a, _ = Registry(1).join("x", name="a", flops=1e9, resume_id=None, now=0.0)
    for s in (3, 5, 3):
        a.hold_shard(s)
    assert a.shards_held == [3, 5]  # once each, the newest first
    for s in range(100, 100 + HELD_SHARDS):
        a.hold_shard(s)
    assert len(a.shards_held) == HELD_SHARDS and a.shards_held[0] == 100 + HELD_SHARDS - 1
