import pytest

from coordinator.core.leases import (
    LEASE_TRANSITIONS,
    TASK_TRANSITIONS,
    LeaseBook,
    LeaseError,
    LeaseState,
    TaskPlan,
    TaskState,
)

PLAN = TaskPlan(kind="local", shard=0, seed=1, steps=2, batch=4)


def test_tables_cover_every_state_and_terminals_are_final() -> None:
    assert set(TASK_TRANSITIONS) == set(TaskState)
    assert set(LEASE_TRANSITIONS) == set(LeaseState)
    for s in LeaseState:
        assert (s is LeaseState.LEASED) == bool(LEASE_TRANSITIONS[s])


def test_lease_lifecycle_and_cancellation_of_copies() -> None:
    book = LeaseBook()
    task = book.new_task(PLAN, version=3, now=0.0)
    a = book.lease(task, "a", now=0.0, deadline=10.0)
    b = book.lease(task, "b", now=1.0, deadline=5.0)
    assert (task.task_id, a.lease_id, b.lease_id) == (1, 1, 2)
    assert book.live_lease_of("a") is a and task.clients == ["a", "b"]
    assert book.due(6.0) == [b]
    with pytest.raises(LeaseError, match="already holds"):
        book.lease(book.new_task(PLAN, version=3, now=0.0), "a", now=1.0, deadline=2.0)
    book.end(a, LeaseState.DONE, 7.0)
    cancelled = book.resolve_task(task, TaskState.ACCEPTED, 7.0)
    assert cancelled == [b] and b.state is LeaseState.CANCELLED
    assert book.live_lease_of("a") is None and book.live_lease_of("b") is None
    with pytest.raises(LeaseError, match="not allowed"):
        book.end(a, LeaseState.EXPIRED, 8.0)
    with pytest.raises(LeaseError, match="cannot lease"):
        book.lease(task, "c", now=8.0, deadline=9.0)
    with pytest.raises(LeaseError, match="not allowed"):
        task.move(TaskState.DROPPED)


def test_next_task_id_never_goes_back() -> None:
    book = LeaseBook()
    book.next_task_id = 50
    assert book.new_task(PLAN, version=0, now=0).task_id == 50
    with pytest.raises(LeaseError, match="reuse"):
        book.next_task_id = 10


def test_leases_resolved_long_before_their_deadline_do_not_pile_up_in_the_heap() -> None:
    book = LeaseBook()
    keep = book.lease(book.new_task(PLAN, version=0, now=0.0), "keep", now=0.0, deadline=50.0)
    for i in range(5000):  # each takes a task and vanishes, deadline far ahead
        t = float(i) * 1e-3
        lease = book.lease(book.new_task(PLAN, version=0, now=t), f"h{i}", now=t, deadline=t + 60)
        book.end(lease, LeaseState.LOST, t)
        book.resolve_task(book.tasks[lease.task_id], TaskState.DROPPED, t)
        assert len(book._deadlines) <= 2 * 2 + 64  # two live at its largest
    assert book.outcomes == {}  # a dropped task leaves no outcome
    assert book.next_deadline() == 50.0 and book.due(70.0) == [keep]


def test_a_restored_outcome_keeps_its_age_and_is_forgotten_on_time() -> None:
    """A checkpoint keeps how old each accepted id is: a coordinator restarted more
    often than ``retain_s`` still forgets them (the soak's restarts every 1-2 min
    kept every id of the run before)."""
    from coordinator.core.leases import LeaseBook

    old = LeaseBook(retain_s=600.0)
    old.remember_accepted([1, 2, 3], [500.0, 300.0, 0.0])
    old.forget(1000.0)
    assert old.accepted_ages(1000.0) == [500.0, 300.0, 0.0]
    again = LeaseBook(retain_s=600.0)
    again.remember_accepted(old.accepted_ids(), old.accepted_ages(1000.0))
    again.forget(0.0)  # a new process: its clock starts anywhere
    again.forget(150.0)
    assert again.accepted_ids() == [2, 3]
    again.forget(350.0)
    assert again.accepted_ids() == [3]
    legacy = LeaseBook(retain_s=600.0)
    legacy.remember_accepted([7])  # a checkpoint without ages: young at the restart
    legacy.forget(5.0)
    assert legacy.accepted_ages(5.0) == [0.0]
