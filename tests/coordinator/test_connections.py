"""The connection table: phases as a transition table, dispatch order, back-off."""

from __future__ import annotations

import pytest

from coordinator.core.connections import (
    CONN_TRANSITIONS,
    DECLINE_BACKOFF_S,
    Conn,
    Connections,
    ConnError,
    ConnState,
)
from coordinator.core.leases import LeaseBook, TaskPlan
from coordinator.core.linkcodecs import LinkCodecs
from coordinator.core.uploads import Uploads
from nn.spec import ModelSpec
from protocol import messages as m
from protocol.limits import profile


def _conn(client_id: str) -> Conn:
    spec = ModelSpec(widths=(4, 2))
    codecs = LinkCodecs.of(spec, "fp32", "fp32", None)
    return Conn(client_id, profile("lan"), Uploads(spec, "fp32"), codecs)


def test_every_phase_has_a_row_and_closed_is_final() -> None:
    assert set(CONN_TRANSITIONS) == set(ConnState)
    assert CONN_TRANSITIONS[ConnState.CLOSED] == frozenset()
    assert all(
        ConnState.CLOSED in CONN_TRANSITIONS[s] for s in ConnState if s is not ConnState.CLOSED
    )


@pytest.mark.parametrize(
    ("start", "to"),
    [
        (ConnState.READY, ConnState.PREFETCH),  # prefetch needs a lease to compute
        (ConnState.READY, ConnState.READY),  # released without holding a lease
        (ConnState.WORKING, ConnState.WORKING),  # leased twice without a prefetch
        (ConnState.CLOSED, ConnState.READY),
    ],
)
def test_a_move_missing_from_the_table_is_a_core_bug(start: ConnState, to: ConnState) -> None:
    conn = _conn("a")
    conn.state = start
    with pytest.raises(ConnError, match=f"{start.value} -> {to.value}"):
        conn.move(to)


def test_dispatch_visits_waiting_connections_in_join_order_and_skips_cooling() -> None:
    table = Connections()
    conns = [_conn(name) for name in ("b", "a", "c")]
    for conn in conns:
        table.add(conn)
    assert [c.client_id for c in table.waiting(0.0)] == ["b", "a", "c"]
    table.leased(conns[0])
    table.declined("a", 2, now=10.0)  # the second in a row: twice the base back-off
    assert table.next_cool_end() == 10.0 + 2 * DECLINE_BACKOFF_S
    assert [c.client_id for c in table.waiting(10.0)] == ["c"]
    assert [c.client_id for c in table.waiting(10.0 + 2 * DECLINE_BACKOFF_S)] == ["a", "c"]
    assert table.next_cool_end() is None  # a back-off that ran out is forgotten
    table.released("b")
    assert conns[0].state is ConnState.READY
    table.remove("a")
    assert conns[1].state is ConnState.CLOSED and "a" not in table.by_id
    table.released("a")  # a lease of a connection already gone: nothing to do
    assert [c.client_id for c in table.waiting(20.0)] == ["b", "c"]


def test_prefetch_only_for_the_live_lease_with_nothing_queued_if_offered_and_paying() -> None:
    table = Connections()
    book = LeaseBook(on_release=table.released)
    conn = _conn("a")
    table.add(conn)
    task = book.new_task(
        TaskPlan(kind="local", shard=0, seed=1, steps=1, batch=1), version=0, now=0
    )
    book.lease(task, "a", now=0.0, deadline=10.0)
    table.leased(conn)
    table.prefetch(conn, m.Prefetch(task_id=str(task.task_id)), book, pays=True)  # not offered
    conn.prefetch = True
    table.prefetch(conn, m.Prefetch(task_id=str(task.task_id)), book, pays=False)
    table.prefetch(conn, m.Prefetch(task_id="999"), book, pays=True)
    assert conn.state is ConnState.WORKING and not list(table.waiting(0.0))
    table.prefetch(conn, m.Prefetch(task_id=str(task.task_id)), book, pays=True)
    table.prefetch(conn, m.Prefetch(task_id=str(task.task_id)), book, pays=True)  # again
    assert conn.state is ConnState.PREFETCH and list(table.waiting(0.0)) == [conn]
