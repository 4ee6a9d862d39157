import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import ErrorCode
from protocol.limits import (
    PROFILES,
    LinkLimits,
    Pacer,
    RateMeter,
    data_cap,
    negotiate,
    profile,
)


def test_profiles():
    rb = profile("roblox")
    assert (rb.bytes_per_s, rb.messages_per_s) == (50_000, 30)
    assert rb.max_message_bytes // 4 >= 4_000_000  # about 4 M float32 per message
    assert set(PROFILES) == {"roblox", "mobile", "lan", "unlimited"}
    with pytest.raises(ValueError, match="unknown profile 'dialup'"):
        profile("dialup")


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"bytes_per_s": 0}, "bytes_per_s"),
        ({"messages_per_s": -1}, "messages_per_s"),
        ({"messages_per_s": math.nan}, "messages_per_s"),
        ({"max_message_bytes": 100}, "max_message_bytes"),
        ({"max_message_bytes": 2048.0}, "max_message_bytes"),
        ({"burst": math.inf}, "burst"),
    ],
)
def test_limits_validation(kw, field):
    args = {"bytes_per_s": 1e3, "messages_per_s": 10, "max_message_bytes": 4096, **kw}
    with pytest.raises(ValueError, match=field):
        LinkLimits(**args)


def test_negotiate_grants_the_tighter_of_each():
    asked = LinkLimits(bytes_per_s=1e9, messages_per_s=5, max_message_bytes=1 << 20, burst=3)
    got = negotiate(asked, profile("roblox"))
    assert got == LinkLimits(
        bytes_per_s=50_000, messages_per_s=5, max_message_bytes=1 << 20, burst=1.0
    )
    assert negotiate(None, profile("lan")) == profile("lan")


def test_a_data_cap_asks_for_half_its_hourly_bytes_each_way():
    """100 MB an hour, down and up together: 13,889 bytes a second each way, the
    server's own message rate and frame size kept (negotiate), so an hour at the
    granted rate moves at most the cap (plus one burst a direction)."""
    cap = data_cap(100)
    assert cap.bytes_per_s * 3600 * 2 == pytest.approx(100e6)
    got = negotiate(cap, profile("roblox"))
    assert got.bytes_per_s == cap.bytes_per_s
    assert (got.messages_per_s, got.max_message_bytes) == (30, profile("roblox").max_message_bytes)
    assert negotiate(data_cap(1e6), profile("roblox")) == profile("roblox")  # the tighter wins
    for bad in (0, -5, math.inf, math.nan, "100", True):
        with pytest.raises(ValueError, match="data cap"):
            data_cap(bad)


def test_pacer_spaces_frames_at_the_byte_rate():
    lim = LinkLimits(bytes_per_s=1000, messages_per_s=100, max_message_bytes=4096, burst=1)
    p = Pacer(lim)
    assert p.next_send_time(1000, 0.0) == 0.0  # a full bucket: one burst goes now
    p.consume(1000, 0.0)
    assert p.next_send_time(500, 0.0) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="not due"):
        p.consume(500, 0.1)
    p.consume(500, 0.5)
    # A frame bigger than the bucket waits for a full bucket, then leaves a debt.
    assert p.next_send_time(4096, 0.5) == pytest.approx(1.5)
    p.consume(4096, 1.5)
    assert p.next_send_time(1, 1.5) == pytest.approx(1.5 + 3.097)


def test_pacer_message_rate_and_time_direction():
    p = Pacer(LinkLimits(bytes_per_s=1e9, messages_per_s=2, max_message_bytes=4096, burst=1))
    for t in (0.0, 0.0, 0.5, 1.0):
        assert p.try_consume(10, t)
    assert not p.try_consume(10, 1.2)
    with pytest.raises(ValueError, match="backwards"):
        p.next_send_time(10, 0.5)
    with pytest.raises(ValueError, match="outside"):
        p.next_send_time(5000, 2.0)


def test_unlimited_never_waits():
    p = Pacer(profile("unlimited"))
    for i in range(1000):
        assert p.try_consume(1 << 20, i * 1e-9)


limits_st = st.builds(
    LinkLimits,
    bytes_per_s=st.floats(100, 1e6),
    messages_per_s=st.floats(0.5, 100),
    max_message_bytes=st.integers(1024, 200_000),
    burst=st.floats(0.01, 3),
)


def _drive(lim, frames):
    """Send each (size, wish) no earlier than wished and no earlier than allowed."""
    p = Pacer(lim)
    now, sent = 0.0, []
    for size, gap in frames:
        now = p.next_send_time(size, now + gap)
        p.consume(size, now)
        sent.append((now, size))
    return sent


@settings(max_examples=150, deadline=None)
@given(limits_st, st.data())
def test_pacer_never_exceeds_rates_beyond_the_burst(lim, data):
    frames = data.draw(
        st.lists(
            st.tuples(st.integers(0, lim.max_message_bytes), st.floats(0, 2)),
            min_size=1,
            max_size=40,
        )
    )
    sent = _drive(lim, frames)
    byte_slack = max(lim.burst_bytes, lim.max_message_bytes)
    for i in range(len(sent)):
        total = 0
        for j in range(i, len(sent)):
            total += sent[j][1]
            window = sent[j][0] - sent[i][0]
            assert total <= lim.bytes_per_s * window + byte_slack + 1e-6 * total
            assert j - i + 1 <= lim.messages_per_s * window + lim.burst_messages + 1e-6


@settings(max_examples=100, deadline=None)
@given(limits_st, st.data())
def test_meter_accepts_a_paced_peer(lim, data):
    frames = data.draw(
        st.lists(st.tuples(st.integers(0, lim.max_message_bytes), st.floats(0, 1)), max_size=40)
    )
    meter = RateMeter(lim)
    for now, size in _drive(lim, frames):
        assert meter.observe(size, now) is None


def test_meter_flags_a_flooding_peer():
    lim = LinkLimits(bytes_per_s=10_000, messages_per_s=1000, max_message_bytes=4096, burst=1)
    meter = RateMeter(lim)
    flags = [meter.observe(2000, i * 0.1) for i in range(100)]  # 20 kB/s: twice the grant
    first = next(f for f in flags if f is not None)
    assert first.code == ErrorCode.RATE_LIMITED and "bytes/s" in first.message
    too_big = RateMeter(lim).observe(5000, 0.0)
    assert too_big is not None and too_big.code == ErrorCode.TOO_LARGE
    msgs = RateMeter(LinkLimits(bytes_per_s=1e9, messages_per_s=10, max_message_bytes=4096))
    flags = [msgs.observe(1, i * 0.01) for i in range(100)]  # 100 msg/s
    assert any(f is not None and "messages/s" in f.message for f in flags)


def test_frame_bytes_is_one_burst_of_the_link_within_the_frame_limit():
    assert profile("roblox").frame_bytes == 50_000  # not the 16 MiB frame limit: 5 min at 50 kB/s
    assert profile("mobile").frame_bytes == 250_000
    assert profile("lan").frame_bytes == profile("lan").max_message_bytes
    assert profile("unlimited").frame_bytes == profile("unlimited").max_message_bytes
    slow = LinkLimits(bytes_per_s=1_000, messages_per_s=10, max_message_bytes=1 << 20)
    assert slow.frame_bytes == 4096  # floor: the envelope must not dominate
    bursty = LinkLimits(bytes_per_s=10_000, messages_per_s=10, max_message_bytes=1 << 20, burst=3)
    assert bursty.frame_bytes == 30_000
