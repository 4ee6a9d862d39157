"""protocol.outbox: order kept, frames released by the pacer, due times honest."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from protocol.limits import LinkLimits, Pacer
from protocol.outbox import PacedOutbox

LINK = LinkLimits(bytes_per_s=10_000, messages_per_s=5, max_message_bytes=4096, burst=1.0)


def test_without_a_pacer_everything_is_due_at_once() -> None:
    box: PacedOutbox[str] = PacedOutbox()
    for i in range(3):
        box.push(f"f{i}", 100_000)
    assert box.next_send_time(7.0) == 7.0
    out: list[str] = []
    box.flush(7.0, out)
    assert out == ["f0", "f1", "f2"] and not box and box.next_send_time(7.0) is None


@given(st.lists(st.integers(min_value=1, max_value=4096), min_size=1, max_size=40))
def test_frames_leave_in_order_each_at_or_after_its_due_time(sizes: list[int]) -> None:
    box: PacedOutbox[int] = PacedOutbox(Pacer(LINK))
    for i, n in enumerate(sizes):
        box.push(i, n)
    sent: list[int] = []
    now = 0.0
    for _ in range(10 * len(sizes)):
        due = box.next_send_time(now)
        if due is None:
            break
        assert due >= now
        now = due
        before = len(sent)
        box.flush(now, sent)
        assert len(sent) > before, "a frame due now goes now"
    assert sent == list(range(len(sizes)))
    # the message bucket: 5/s with a burst of 5, so n frames need (n - 5) / 5 s at least
    assert now >= max(0, len(sizes) - 5) / 5 - 1e-9
