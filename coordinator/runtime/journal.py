"""The journal: a log of in-place merges that makes an ack durable without writing the model.

A job whose every result is one in-place merge of a sub-model delta
(``Coordinator.merges_in_place``) changes the model by ``params += scale *
subnet.expand(update)`` per result, so logging ``(subnet, update, scale)`` (about the size of
the upload, not the model) is enough to redo it: after a restart, ``Coordinator.replay``
applies the logged merges newer than the restored checkpoint, in order, to the same bits. The
service releases an ack once its merge is in the log (one fsync per batch:
storage.GroupCommit); checkpoints only bound the replay, and each truncates the log it covers.

Call order (core thread, except where said): ``observe`` submits every ``MergedInPlace`` of a
batch of outputs; a model step with no such merge (a rebase onto a root's model, a revert) is
a *gap*: acks after it wait for a checkpoint taken after it until one commits. ``sealed``,
called once the batch's acks are held, asks the log writer to report the batch's durability
with the last held sequence number: everything held up to it is durable when the report says
so and no gap is open. The log is its own SQLite file beside the store (``<store>.journal``).
A merge whose upload's chunks were kept (``MergedInPlace.wire``) is logged as those frames plus
the validator's clip factor; replay decodes them with the same Reassembler and multiplies by
the same float32 clip. Design and figures: docs/operations.md ("Jobs merged in place").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import msgpack
import numpy as np

from coordinator.core import events as ev
from nn.spec import ModelSpec
from nn.subnet import Subnet
from protocol import messages as m
from protocol.reassembly import Reassembler
from storage.deltalog import DeltaEntry, DeltaLog
from storage.groupcommit import GroupCommit

log = logging.getLogger(__name__)

Merge = tuple[int, int, Subnet, np.ndarray, float]

#: logged deltas waiting for the disk beyond this many bytes make the core wait
MAX_QUEUED_BYTES = 256 << 20


def journal_path(store: Path) -> Path:
    return Path(f"{store}.journal")


class Journal:
    """The log, its group commit, and the gap bookkeeping; see the module docstring."""

    def __init__(self, store: Path, spec: ModelSpec) -> None:
        self.path = journal_path(store)
        self.spec = spec
        self.log = DeltaLog(self.path)
        # A disk that falls behind (its fsyncs waiting on a big checkpoint) slows
        # the core thread here instead of queueing deltas without bound.
        self._commit = GroupCommit(self.log, max_queued_bytes=MAX_QUEUED_BYTES)
        self._pending: list[Future[None]] = []  # this batch's submissions
        #: version of the first model step since the last commit the log misses
        self.gap: int | None = None
        #: task ids whose merges are durable in the log (for duplicate acks)
        self.durable: set[int] = set()
        self.logged = 0
        #: the bytes of the entries logged (wire form or float32)
        self.logged_bytes = 0
        self.replayed = 0

    def merges(self, after_version: int) -> Iterator[Merge]:
        """The logged merges newer than ``after_version``, for ``Coordinator.replay``."""
        for e in self.log.replay(after_version):
            subnet = Subnet.from_state(self.spec, dict(e.meta["subnet"]))
            update = e.delta if e.payload is None else _unwire(e.payload, subnet, e.result_id)
            clip = float(e.meta.get("clip", 1.0))
            if clip != 1.0:  # what the validator's clip computed, in the same float32
                update = update * np.float32(clip)
            yield int(e.result_id), e.version, subnet, update, e.weight

    def observe(self, outputs: list[ev.Output]) -> None:
        """Log this batch's merges; note a step the log cannot redo."""
        merged: set[int] = set()
        for o in outputs:
            if isinstance(o, ev.MergedInPlace):
                merged.add(o.version)
                meta: dict[str, object] = {"subnet": o.subnet.to_state()}
                if o.wire is not None:
                    delta, payload = _EMPTY, _wire(o.wire)
                    meta["clip"] = float(o.clip)
                else:
                    delta = np.ascontiguousarray(o.update, dtype=np.float32).reshape(-1)
                    payload = None
                entry = DeltaEntry(
                    result_id=str(o.task_id),
                    base_version=o.version - 1,
                    version=o.version,
                    weight=float(o.scale),
                    delta=delta,
                    meta=meta,
                    payload=payload,
                )
                self.logged_bytes += entry.nbytes
                fut = self._commit.submit(entry)
                fut.add_done_callback(lambda f, tid=o.task_id: self._done(f, tid))
                self._pending.append(fut)
        for o in outputs:
            if isinstance(o, ev.ModelUpdated) and o.version not in merged and self.gap is None:
                log.info(
                    "v%d: a step the journal cannot redo; acks wait for a checkpoint", o.version
                )
                self.gap = o.version

    def _done(self, fut: Future[None], task_id: int) -> None:  # the log's thread
        if fut.exception() is None:
            self.durable.add(task_id)  # a set add is atomic under the GIL

    def sealed(self, cover: int, report: Callable[[int, bool], None]) -> None:
        """The batch's acks are held up to ``cover``: ``report(cover, ok)`` (on the
        log's thread) once all of the batch's entries are durable or one failed."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        self.logged += len(pending)
        left = [len(pending)]
        failed = [False]
        lock = threading.Lock()  # an entry done already calls back on this thread

        def one(f: Future[None]) -> None:
            with lock:
                failed[0] |= f.exception() is not None
                left[0] -= 1
                last = left[0] == 0
            if last:
                report(cover, not failed[0])

        for f in pending:
            f.add_done_callback(one)

    def failed(self, version: int) -> None:
        """An append failed: acks wait for a checkpoint taken from now on."""
        log.error("journal append failed; acks wait for a checkpoint after v%d", version)
        if self.gap is None:
            self.gap = version

    def committed(self, version: int, tasks: frozenset[int]) -> None:
        """A checkpoint at ``version`` holding ``tasks`` is committed: a gap at or
        before it is closed, and its tasks are answered from the checkpoint."""
        if self.gap is not None and version >= self.gap:
            self.gap = None
        self.durable -= tasks

    def truncate(self, version: int) -> None:
        """Drop what a committed checkpoint at ``version`` covers (writer thread)."""
        self.log.truncate(version)

    def summary(self) -> dict[str, int | bool]:
        return {
            "logged": self.logged,
            "logged_bytes": self.logged_bytes,
            "replayed": self.replayed,
            "gap": self.gap is not None,
        }

    def close(self) -> None:
        self._commit.close()
        self.log.close()


_EMPTY = np.empty(0, dtype=np.float32)


def _wire(chunks: tuple[m.Chunk, ...]) -> bytes:
    """An upload's chunks as one payload: a msgpack list of their frames."""
    return msgpack.packb([m.encode(c) for c in chunks], use_bin_type=True)


def _unwire(payload: bytes, subnet: Subnet, task_id: str) -> np.ndarray:
    """The update a wire-form entry's frames decode to (in the subnet's layout)."""
    frames = msgpack.unpackb(payload, raw=False)
    reasm = Reassembler.for_params(subnet.sub, transfer=task_id, total=len(frames))
    for frame in frames:
        chunk = m.decode(frame)
        if not isinstance(chunk, m.Chunk):
            raise ValueError(f"journal entry {task_id}: a {type(chunk).__name__} among its chunks")
        reasm.add(chunk)
    if not reasm.done:
        raise ValueError(f"journal entry {task_id}: its chunks do not cover the subnet")
    return reasm.params().data
