"""GroupCommit: many concurrent acknowledgements, one fsync per batch.

Theory of operation. Results arrive one by one from many clients, but an fsync
costs the same for one entry as for fifty. ``submit`` queues an entry and
returns a future; one writer thread takes everything queued (up to
``max_batch``), appends it to the ``DeltaLog`` in one transaction, and resolves
those futures. While that fsync runs the next batch gathers, so the batch size
adapts to load with no timer: one result alone pays one fsync, a burst shares.

Backpressure: with ``max_queued_bytes`` set, ``submit`` waits while the deltas
queued or being appended would exceed it (one entry always goes), so a disk that
falls behind (an fsync that waits for a big checkpoint's writes) slows the
producer instead of growing memory without bound.

Call order: ``submit`` any number of times from any thread, then ``close`` once
(it drains the queue). An asyncio driver awaits ``asyncio.wrap_future(fut)``
and sends the acknowledgement only after it resolves.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future

from storage.deltalog import DeltaEntry, DeltaLog
from storage.errors import StorageError


class GroupCommit:
    """Batches ``DeltaLog.append`` calls from concurrent producers; see the module docstring."""

    def __init__(
        self, log: DeltaLog, *, max_batch: int = 256, max_queued_bytes: int | None = None
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch: must be >= 1, got {max_batch}")
        if max_queued_bytes is not None and max_queued_bytes < 1:
            raise ValueError(f"max_queued_bytes: must be >= 1, got {max_queued_bytes}")
        self.log = log
        self.max_batch = max_batch
        self.max_queued_bytes = max_queued_bytes
        #: delta bytes submitted and not yet appended (or failed)
        self.queued_bytes = 0
        #: seconds producers spent waiting for room (backpressure), in total
        self.waited_s = 0.0
        self.batches = 0  # appends done, for metrics: entries / batches = mean batch
        self.entries = 0
        self._queue: deque[tuple[DeltaEntry, Future[None]]] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name="crowdgrad-group-commit", daemon=True
        )
        self._thread.start()

    def submit(self, entry: DeltaEntry) -> Future[None]:
        """Queue ``entry``; the future resolves once it is durable (or fails with the error)."""
        fut: Future[None] = Future()
        size = entry.nbytes
        with self._cond:
            limit = self.max_queued_bytes
            if limit is not None and self.queued_bytes and self.queued_bytes + size > limit:
                t0 = time.monotonic()
                self._cond.wait_for(
                    lambda: (
                        self._closed or not self.queued_bytes or self.queued_bytes + size <= limit
                    )
                )
                self.waited_s += time.monotonic() - t0
            if self._closed:
                raise StorageError("group commit is closed")
            self._queue.append((entry, fut))
            self.queued_bytes += size
            self._cond.notify_all()
        return fut

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                n = min(len(self._queue), self.max_batch)
                batch = [self._queue.popleft() for _ in range(n)]
            try:
                self.log.append(e for e, _ in batch)
            except BaseException as exc:  # every waiter learns its entry is not durable
                self._done(batch)
                for _, fut in batch:
                    fut.set_exception(exc)
                continue
            self._done(batch)
            self.batches += 1
            self.entries += len(batch)
            for _, fut in batch:
                fut.set_result(None)

    def _done(self, batch: list[tuple[DeltaEntry, Future[None]]]) -> None:
        with self._cond:
            self.queued_bytes -= sum(e.nbytes for e, _ in batch)
            self._cond.notify_all()

    def close(self) -> None:
        """Stop taking entries, make every queued one durable, stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
