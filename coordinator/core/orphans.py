"""Tasks that lost their lease: leased again, held open for a client that may
resume, or dropped.

Theory of operation. A lease ends without a result when its deadline passes
(:meth:`Orphans.expire_leases`), when its client leaves (the core's drop, then
:meth:`Orphans.lost`) or when the client says it will not do the task
(:meth:`Orphans.declined`). Once the task has no live lease left, replication
may settle it (a twin is dropped; a primary's twin stands for it:
coordinator/core/replication.py); otherwise the strategy may lease it again at once
(a sync round's slot). If it does not, the task stays OPEN for
``lease.resume_grace_s``, so a client that reconnects with its resume token
may still deliver it (docs/coordinator.md, "Tasks and leases"); when the grace
runs out the task is DROPPED and an async strategy revisits its shard with a new
task. A declined task gets no grace (its client said it will not deliver), and
after the job finished a task that lost its lease is simply dropped.

The held tasks are a dict in ``orphaned_at`` order (time never decreases; a task
orphaned again is re-inserted), so expiry and the next wake-up look at its head
only; one leased again, taken or dropped since is skipped there. At most ``cap``
are held (two per resumable client: a current and a queued task); past that, and
for a holder the registry forgot, the oldest goes as if its grace ran out; and
when the registry forgets a holder (``forget_holders``), its held tasks go at once.
"""

from __future__ import annotations

from coordinator.core import events as ev
from coordinator.core.leases import LeaseBook, LeaseState, Task, TaskState
from coordinator.core.registry import Registry
from coordinator.core.replication import Replicator
from coordinator.core.strategies import Strategy


class Orphans:
    """The resume grace's one timer owner (see the module docstring)."""

    __slots__ = (
        "_book", "_by_holder", "_held", "_holder_of", "_registry", "_strategy", "_verifier",
        "cap", "grace_s",
    )  # fmt: skip

    def __init__(
        self,
        book: LeaseBook,
        registry: Registry,
        strategy: Strategy,
        verifier: Replicator,
        *,
        grace_s: float,
        cap: int,
    ) -> None:
        self._book = book
        self._registry = registry
        self._strategy = strategy
        self._verifier = verifier
        self.grace_s = grace_s
        self.cap = cap
        self._held: dict[int, Task] = {}
        #: held task ids by the resume id of the client that may deliver them, and back
        self._by_holder: dict[str, set[int]] = {}
        self._holder_of: dict[int, str] = {}

    # -- leases that ended without a result ----------------------------------------

    def lost(self, task: Task, now: float, *, finished: bool) -> bool:
        """A task lost a lease: returns whether the strategy leases it again."""
        if task.state is not TaskState.OPEN or self._book.live_leases(task):
            return False
        if finished:
            self._book.resolve_task(task, TaskState.DROPPED, now)
            return False
        if self._verifier.copy_lost(task, now):
            return False  # a twin, dropped; or a primary whose twin's result stands for it
        reissue = self._strategy.on_lease_lost(task, now)
        if not reissue:  # held open while its holder may resume
            self.hold(task, now)
        return reissue

    def declined(self, task: Task, now: float) -> bool:
        """Its client declined the task: leased again (returns True) or dropped,
        with no resume grace: its client said it will not deliver."""
        book = self._book
        if (
            task.state is not TaskState.OPEN
            or book.live_leases(task)
            or self._verifier.copy_lost(task, now)
        ):
            return False
        reissued = self._strategy.on_lease_lost(task, now)
        if not reissued:
            self.discard(task.task_id)
            book.resolve_task(task, TaskState.DROPPED, now)
        return reissued

    def expire_leases(self, now: float, out: list[ev.Output]) -> None:
        """End the live leases whose deadline passed by ``now`` (the job runs)."""
        book = self._book
        for lease in book.due(now):
            if not lease.live:  # cancelled since: a lost primary takes its twin
                continue
            book.end(lease, LeaseState.EXPIRED, now)
            expired = self._registry.get(lease.client_id)
            if expired is not None:
                expired.version_held = None  # it may not have finished the download
            task = book.tasks[lease.task_id]
            reissued = self.lost(task, now, finished=False)
            out.append(
                ev.LeaseExpired(
                    client_id=lease.client_id,
                    task_id=task.task_id,
                    lease_id=lease.lease_id,
                    reissued=reissued,
                    now=now,
                )
            )

    # -- the resume grace ----------------------------------------------------------

    def hold(self, task: Task, now: float) -> None:
        """Hold an OPEN task that lost its lease, dropping the oldest over the cap."""
        task.orphaned_at = now
        held = self._held
        self.discard(task.task_id)
        held[task.task_id] = task
        holder = self._book.leases[task.leases[-1]].holder
        self._holder_of[task.task_id] = holder
        self._by_holder.setdefault(holder, set()).add(task.task_id)
        while held:
            oldest = next(iter(held.values()))
            if oldest.state is TaskState.OPEN and oldest.orphaned_at is not None:
                holder = self._holder_of[oldest.task_id]
                if len(held) <= self.cap and self._registry.lookup(holder) is not None:
                    break
                self._book.resolve_task(oldest, TaskState.DROPPED, now)
            self.discard(oldest.task_id)

    def forget_holders(self, resume_ids: list[str], now: float) -> None:
        """The registry forgot these clients: the tasks held for them go now, not
        when they reach the head (a flood of strangers would fill ``cap`` first)."""
        for resume_id in resume_ids:
            for tid in sorted(self._by_holder.get(resume_id, ())):
                task = self._held[tid]
                self.discard(tid)
                if task.state is TaskState.OPEN and task.orphaned_at is not None:
                    self._book.resolve_task(task, TaskState.DROPPED, now)

    def discard(self, task_id: int) -> None:
        """The task was leased again, taken or dropped: no longer held."""
        if self._held.pop(task_id, None) is None:
            return
        holder = self._holder_of.pop(task_id)
        ids = self._by_holder.get(holder)
        if ids is not None:
            ids.discard(task_id)
            if not ids:
                del self._by_holder[holder]

    def clear(self) -> None:
        self._held.clear()
        self._by_holder.clear()
        self._holder_of.clear()

    def expire(self, now: float) -> None:
        """Drop the held tasks whose grace ran out by ``now``."""
        held = self._held
        while held:
            tid, task = next(iter(held.items()))
            if task.state is not TaskState.OPEN or task.orphaned_at is None:
                self.discard(tid)  # taken, dropped or leased again since
            elif now >= task.orphaned_at + self.grace_s:
                self.discard(tid)
                self._book.resolve_task(task, TaskState.DROPPED, now)
            else:
                break

    def next_expiry(self) -> float | None:
        """When the oldest held task's grace runs out (None: none held)."""
        for task in self._held.values():
            if task.orphaned_at is not None:
                return task.orphaned_at + self.grace_s
        return None
