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
    r1.leave("x")
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
