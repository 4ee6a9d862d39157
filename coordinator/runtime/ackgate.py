"""Acknowledge after durable: acks that promise a result is in wait for the write.

An ``Ack`` that tells a client its result is in (accepted, or a duplicate of one
accepted) is held until a committed checkpoint, or the journal, holds that result,
so a crash never loses a result a client saw acknowledged. Each held ack gets a
sequence number; a snapshot or journal batch *covers* every number up to the one
current when it was taken, and releases them when it reports back. Refusals and
other frames pass: a client matches acks by task id, so their order is free.

At the job's end the ``bye`` and closes wait behind the acks held before them, so
every result a client was told is in is acked before its ``bye``. No threads and
no clock: the runtime calls it on the core thread and dispatches what it returns.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from enum import Enum

from coordinator.core import events as ev
from protocol import messages as m

log = logging.getLogger(__name__)


class GateState(Enum):
    #: nothing held: every output passes
    OPEN = "open"
    #: acks wait for the checkpoint or journal batch that covers them
    HOLDING = "holding"
    #: the job ended with acks held: its last frames wait behind them
    ENDING = "ending"
    #: the job's last frames went out
    ENDED = "ended"


class AckGate:
    """Held acks by sequence number; see the module docstring."""

    def __init__(self) -> None:
        self._held: deque[tuple[int, ev.Send]] = deque()
        #: the newest sequence number given to a held ack: what a snapshot covers
        self.seq = 0
        #: task ids of the newest committed checkpoint (their duplicates pass)
        self.committed: frozenset[int] = frozenset()
        #: the job's last outputs and the newest held ack they follow
        self._tail: tuple[int, list[ev.Output]] | None = None
        self._ended = False

    @property
    def state(self) -> GateState:
        if self._ended:
            return GateState.ENDED
        if self._tail is not None:
            return GateState.ENDING
        return GateState.HOLDING if self._held else GateState.OPEN

    def __len__(self) -> int:
        return len(self._held)

    def admit(self, outputs: list[ev.Output], durable: Callable[[int], bool]) -> list[ev.Output]:
        """The outputs that may go now; acks that promise work not yet durable are
        held (``durable(task_id)``: a journal already holds that task's merge)."""
        return [o for o in outputs if not self._hold(o, durable)]

    def _hold(self, o: ev.Output, durable: Callable[[int], bool]) -> bool:
        if not isinstance(o, ev.Send) or not isinstance(o.message, m.Ack):
            return False
        ack = o.message
        if not ack.accepted and ack.reason != "duplicate":
            return False  # a refusal promises nothing
        if ack.reason == "duplicate" and ack.task_id.isdigit():
            task = int(ack.task_id)
            if task in self.committed or durable(task):
                return False
        self.seq += 1
        self._held.append((self.seq, o))
        return True

    def end(self, outputs: list[ev.Output]) -> list[ev.Output]:
        """The job finished in ``outputs``: what goes now. With acks held, the
        outputs after ``JobFinished`` (byes, closes) wait for them (state ENDING);
        without, everything goes and the gate is ENDED."""
        end = next((i for i, o in enumerate(outputs) if isinstance(o, ev.JobFinished)), None)
        assert end is not None, "end: no JobFinished in the outputs"
        if not self._held:
            self._ended = True
            return outputs
        self._tail = (self.seq, outputs[end + 1 :])
        return outputs[: end + 1]

    def committed_upto(self, cover: int, tasks: frozenset[int]) -> list[ev.Output]:
        """A checkpoint covering ``cover`` committed, holding ``tasks``: release."""
        self.committed = tasks
        return self.released_upto(cover)

    def released_upto(self, cover: int) -> list[ev.Output]:
        """Acks up to ``cover`` are durable (a checkpoint, or the journal's batch)."""
        released: list[ev.Output] = []
        while self._held and self._held[0][0] <= cover:
            released.append(self._held.popleft()[1])
        return self._with_tail(released)

    def superseded(self, cover: int) -> list[ev.Output]:
        """The snapshot covering ``cover`` was of a version the store already had.
        Normally the next version's checkpoint releases them; once the job is over
        none will come, and results taken since that copy (a sync buffer never
        merged) are not durable: not taken after all, and answered so (§6: every
        result not taken gets ``ack accepted=false``)."""
        tail = self._tail
        if tail is None or cover < tail[0]:
            return []
        released: list[ev.Output] = []
        while self._held and self._held[0][0] <= tail[0]:
            send = self._held.popleft()[1]
            task_id = send.message.task_id  # type: ignore[union-attr]
            log.info("job finished: result %s is in no checkpoint; acked stale", task_id)
            refusal = m.Ack(task_id=task_id, accepted=False, reason="stale")
            released.append(
                ev.Send(client_id=send.client_id, message=refusal, frame=m.encode(refusal))
            )
        return self._with_tail(released)

    def _with_tail(self, released: list[ev.Output]) -> list[ev.Output]:
        """The job's last frames follow the last ack held before them."""
        tail = self._tail
        if tail is None or (self._held and self._held[0][0] <= tail[0]):
            return released
        self._tail, self._ended = None, True
        return released + tail[1]
