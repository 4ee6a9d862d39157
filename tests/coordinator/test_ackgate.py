"""The ack gate: an ack that promises a result is in goes out only once a write
covering it reports back, and the job's last frames never pass an ack held before
them. Sans-IO: driven by hand here, in any order a writer could report."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core import events as ev
from coordinator.runtime.ackgate import AckGate, GateState
from protocol import messages as m


def send(msg: m.Message, client: str = "c1") -> ev.Send:
    return ev.Send(client_id=client, message=msg, frame=m.encode(msg))


def ack(task: int, accepted: bool = True, reason: str = "") -> ev.Send:
    return send(m.Ack(task_id=str(task), accepted=accepted, reason=reason))


def never(task_id: int) -> bool:
    return False


FINISHED = ev.JobFinished(version=9, reason="max_versions", accuracy=0.5, now=1.0)
BYE = send(m.Bye(reason="max_versions"))


def test_refusals_and_other_frames_pass_and_promises_wait() -> None:
    gate = AckGate()
    hb = send(m.Heartbeat(seq=1, time=0.0))
    out = gate.admit([ack(1), ack(2, False, "stale"), hb, ack(3)], never)
    assert out == [ack(2, False, "stale"), hb]
    assert len(gate) == 2 and gate.seq == 2 and gate.state is GateState.HOLDING
    assert gate.released_upto(1) == [ack(1)]
    assert gate.committed_upto(2, frozenset({1, 3})) == [ack(3)]
    assert gate.state is GateState.OPEN


def test_a_duplicate_of_a_committed_or_journaled_result_passes() -> None:
    gate = AckGate()
    gate.committed = frozenset({5})
    dup5, dup6, dup7 = (ack(t, False, "duplicate") for t in (5, 6, 7))
    assert gate.admit([dup5, dup6, dup7], lambda t: t == 6) == [dup5, dup6]
    assert len(gate) == 1  # 7's original is not durable yet: its duplicate promises it


def test_the_bye_waits_for_the_acks_held_before_it() -> None:
    gate = AckGate()
    gate.admit([ack(1), ack(2)], never)
    assert gate.end([FINISHED, BYE]) == [FINISHED]
    assert gate.state is GateState.ENDING
    assert gate.released_upto(1) == [ack(1)]
    assert gate.state is GateState.ENDING
    assert gate.released_upto(2) == [ack(2), BYE]
    assert gate.state is GateState.ENDED


def test_without_held_acks_the_end_passes_at_once() -> None:
    gate = AckGate()
    assert gate.end([ack(1, False, "stale"), FINISHED, BYE]) == [
        ack(1, False, "stale"),
        FINISHED,
        BYE,
    ]
    assert gate.state is GateState.ENDED


def test_a_superseded_snapshot_at_the_end_answers_held_acks_stale() -> None:
    gate = AckGate()
    gate.admit([ack(4)], never)
    assert gate.superseded(1) == []  # before the end: the next version releases it
    gate.end([FINISHED, BYE])
    assert gate.superseded(1) == [ack(4, False, "stale"), BYE]
    assert gate.state is GateState.ENDED


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["ack", "refuse", "release"]), st.integers(0, 12))),
    st.booleans(),
)
def test_no_promise_leaves_before_its_cover_and_the_bye_is_last(ops, end) -> None:
    gate = AckGate()
    out: list[ev.Output] = []
    seq_of: dict[int, int] = {}
    released_cover = 0
    task = 0
    for op, n in ops:
        if op == "release":
            cover = min(n, gate.seq)
            released_cover = max(released_cover, cover)
            out += gate.released_upto(cover)
            continue
        task += 1
        if op == "ack":
            seq_of[task] = gate.seq + 1
        out += gate.admit([ack(task, op == "ack", "" if op == "ack" else "stale")], never)
    if end:
        out += gate.end([FINISHED, BYE])
    for o in out:
        if isinstance(o, ev.Send) and isinstance(o.message, m.Ack) and o.message.accepted:
            assert seq_of[int(o.message.task_id)] <= released_cover
    if end:
        out += gate.released_upto(gate.seq)
        assert out[-1] == BYE and gate.state is GateState.ENDED
        acks = [o for o in out if isinstance(o, ev.Send) and isinstance(o.message, m.Ack)]
        assert {int(o.message.task_id) for o in acks if o.message.accepted} == set(seq_of)
