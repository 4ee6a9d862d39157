import pytest

from coordinator.registry import Registry


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
    a.rejections = 2
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
