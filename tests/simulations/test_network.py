import math

import numpy as np
import pytest

from simulations.distributions import Fixed, Uniform
from simulations.engine import Engine
from simulations.network import Channel, FrameTooLarge, Link, LinkSpec


def channel(**kw):
    args = {
        "bandwidth": 1000.0,
        "messages_per_s": math.inf,
        "burst": 1,
        "max_frame_bytes": math.inf,
        "latency": Fixed(value=0.1),
        "rng": np.random.default_rng(0),
    }
    args.update(kw)
    return Channel(**args)


def test_delivery_is_transmit_plus_latency_on_idle_channel():
    ch = channel()
    assert ch.send(2.0, 500) == pytest.approx(2.0 + 0.5 + 0.1)


def test_frames_queue_behind_each_other():
    ch = channel()
    assert ch.send(0.0, 1000) == pytest.approx(1.1)
    # sent at 0.5 while the first still occupies the link until 1.0
    assert ch.send(0.5, 500) == pytest.approx(1.0 + 0.5 + 0.1)
    # sent after the link is free again
    assert ch.send(3.0, 100) == pytest.approx(3.0 + 0.1 + 0.1)
    assert ch.bytes_sent == 1600 and ch.frames_sent == 3


def test_message_rate_token_bucket():
    ch = channel(bandwidth=math.inf, messages_per_s=10.0, burst=2, latency=Fixed(value=0.0))
    times = [ch.send(0.0, 1) for _ in range(5)]
    assert times == pytest.approx([0.0, 0.0, 0.1, 0.2, 0.3])
    assert ch.throttled == 3
    # after a long pause the bucket is full again (burst 2)
    assert ch.send(10.0, 1) == pytest.approx(10.0)
    assert ch.send(10.0, 1) == pytest.approx(10.0)
    assert ch.send(10.0, 1) == pytest.approx(10.1)


def test_random_latency_never_reorders_frames():
    ch = channel(bandwidth=math.inf, latency=Uniform(low=0.0, high=1.0))
    times = [ch.send(i * 0.01, 10) for i in range(200)]
    assert times == sorted(times)


def test_frame_too_large_is_refused():
    ch = channel(max_frame_bytes=100)
    ch.send(0.0, 100)
    with pytest.raises(FrameTooLarge, match="101 bytes exceeds"):
        ch.send(0.0, 101)


def test_link_spec_validation():
    with pytest.raises(ValueError, match=r"link\.bandwidth_up"):
        LinkSpec(bandwidth_up=0)
    with pytest.raises(ValueError, match=r"link\.burst"):
        LinkSpec(burst=0)
    spec = LinkSpec(latency=Fixed(value=0.05), bandwidth_down=50_000)
    assert spec.one_way(50_000, up=False) == pytest.approx(1.05)


def test_link_delivers_on_engine_and_drop_loses_frames_in_flight():
    eng = Engine(seed=1)
    spec = LinkSpec(latency=Fixed(value=0.1), bandwidth_up=1000, bandwidth_down=1000)
    link = Link(eng, spec, name="c0")
    got = []
    assert link.send(up=True, nbytes=100, on_delivery=got.append, args=("a",)) == pytest.approx(0.2)
    link.send(up=False, nbytes=1000, on_delivery=got.append, args=("b",))  # lands at 1.1
    link.send(up=False, nbytes=10, on_delivery=got.append, args=("c",))  # lands at 1.11
    eng.run_until(0.5)
    assert got == ["a"]
    assert link.in_flight() == 2
    assert link.drop() == 2  # mid-message: "b" is half transmitted
    eng.run_until(5.0)
    assert got == ["a"]
    assert link.send(up=True, nbytes=1, on_delivery=got.append, args=("d",)) is None
    assert link.frames_lost == 3


def test_same_seed_same_delivery_times():
    def run(seed):
        eng = Engine(seed=seed)
        link = Link(eng, LinkSpec(latency=Uniform(low=0, high=0.3)), name="c7")
        return [link.send(up=True, nbytes=5, on_delivery=lambda: None) for _ in range(20)]

    assert run(4) == run(4)
    assert run(4) != run(5)


def test_every_link_profile_becomes_a_link_spec():
    """``unlimited`` has no message-rate limit, so an infinite burst: it became
    ``int(inf)`` and raised OverflowError."""
    from protocol.limits import PROFILES

    for name, limits in PROFILES.items():
        spec = LinkSpec.from_limits(limits)
        assert spec.burst >= 1, name
    unlimited = LinkSpec.from_limits(PROFILES["unlimited"])
    ch = channel(
        bandwidth=unlimited.bandwidth_up,
        messages_per_s=unlimited.messages_per_s,
        burst=unlimited.burst,
        latency=Fixed(value=0.0),
    )
    assert [ch.send(0.0, 100) for _ in range(3)] == [0.0, 0.0, 0.0]  # nothing waits
