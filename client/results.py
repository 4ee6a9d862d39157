"""A finished compute as the frames that carry it, kept until the server acks it.

``result_messages`` is a pure function of the task, the update and the granted
limits (and, for a task with ``error_feedback``, the session's residual, which
it updates): the upload codec, chunk sizes, block-spanning chunks, a layer-split
task's boundary rows after the update (§3.3.2) and stochastic rounding's draws
from the task's seed (§12.1) are all decided here. :class:`Unacked` keeps each
result's frames for resending until its ack (§6), at most ``MAX_UNACKED``.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from compression import ErrorFeedback, codecs
from nn.params import Params
from protocol import messages as m
from protocol.chunking import Block, chunk_params, iter_chunks, params_arrays, params_layout
from protocol.feedback import feedback_chunks
from protocol.limits import LinkLimits

log = logging.getLogger(__name__)

#: Results kept for resending while their acks are outstanding; with this many,
#: the next task waits for an ack (at most half its lease) before it computes.
MAX_UNACKED = 16

#: the task seed's generator stream for stochastic rounding (docs/protocol.md §12.1)
ROUNDING_STREAM = 1


def rounding_rng(task: m.Task) -> Any:
    """The draws of a stochastic-rounding (``-sr``) upload codec: stream 1 of the
    task's seed, so the bytes are a function of the task like the update itself.
    None for other codecs (they draw nothing), which keeps numba out of the import."""
    if not task.upload_codec.endswith("-sr"):
        return None
    from nn.rng import Xoshiro128ss

    return Xoshiro128ss(task.seed, ROUNDING_STREAM)


def result_messages(
    task: m.Task,
    update: np.ndarray,
    *,
    limits: LinkLimits | None,
    spans: bool,
    feedback: ErrorFeedback | None,
    boundary: np.ndarray | None,
    loss: float | None,
    samples: int,
    steps: int,
    compute_seconds: float,
    metrics: dict[str, float] | None,
) -> list[m.Message]:
    """The ``result`` of ``task`` and its chunks, in sending order. An ``evaluate``
    task uploads no chunks (``update`` is ignored); ``feedback`` (the session's,
    for the task's codec) is used when the task asks for error feedback."""
    limit = limits.max_message_bytes if limits else 1 << 20
    target = limits.frame_bytes if limits else None
    framing: dict[str, Any] = {
        "max_message_bytes": limit,
        "transfer": task.task_id,
        "rng": rounding_rng(task),
        "target_bytes": target,
        "spans": spans,
    }
    delta = None
    if task.kind != "evaluate":
        delta = Params.from_flat(
            task.spec, np.ascontiguousarray(update, dtype=np.float32), copy=False
        )
    if delta is None:
        chunks = []
    elif task.error_feedback:
        assert feedback is not None
        chunks = feedback_chunks(delta, feedback, **framing)
    elif boundary is not None and task.boundary is not None:  # the update, then (L, "h")
        h = np.ascontiguousarray(boundary, dtype=np.float32)
        hblock = Block(task.spec.num_layers, "h", tuple(h.shape))
        layout = (*params_layout(task.spec), hblock)
        arrays = [*params_arrays(delta), h]
        chunks = list(iter_chunks(layout, arrays, codec=task.upload_codec, **framing))
    else:
        chunks = chunk_params(delta, codec=task.upload_codec, **framing)
    result = m.Result(
        task_id=task.task_id,
        model_version=task.model_version,
        kind=task.kind,
        num_chunks=len(chunks),
        loss=None if loss is None or not math.isfinite(loss) else float(loss),
        samples=samples,
        steps=steps,
        compute_seconds=max(0.0, compute_seconds),
        metrics=dict(metrics or {}),
    )
    return [result, *chunks]


def feedback_for(task: m.Task, kept: ErrorFeedback | None) -> ErrorFeedback | None:
    """The residual ``task``'s upload adds to (``kept``, unless it was another
    codec's), or ``kept`` for a task without error feedback."""
    if not task.error_feedback or task.kind == "evaluate":
        return kept
    codec = codecs.get(task.upload_codec)
    return kept if kept is not None and kept.codec is codec else ErrorFeedback(codec)


@dataclass(slots=True)
class Pending:
    """A finished result awaiting its ack: the result message and its chunks."""

    task_id: str
    messages: list[m.Message]


class Unacked:
    """Results awaiting their acks, oldest first, by task id (``by_task``), and the
    ids of the newest the server accepted (``accepted``)."""

    def __init__(self) -> None:
        self.by_task: dict[str, Pending] = {}
        self.accepted: deque[str] = deque(maxlen=MAX_UNACKED)
        #: results dropped without an ack (more than MAX_UNACKED awaited theirs)
        self.dropped = 0

    def keep(self, task_id: str, messages: list[m.Message]) -> Pending:
        """Keep a result; past ``MAX_UNACKED`` (a wait for acks ran out) the oldest
        goes, said once."""
        pending = self.by_task[task_id] = Pending(task_id, messages)
        while len(self.by_task) > MAX_UNACKED:
            dropped = next(iter(self.by_task))
            del self.by_task[dropped]
            self.dropped += 1
            if self.dropped == 1:
                log.warning(
                    "result %s: no ack among the last %d within half a lease; not kept "
                    "(later ones are counted, not logged)", dropped, MAX_UNACKED,
                )  # fmt: skip
        return pending

    def ack(self, ack: m.Ack) -> None:
        self.by_task.pop(ack.task_id, None)
        if ack.accepted:
            self.accepted.append(ack.task_id)
        else:
            log.info("result %s refused: %s", ack.task_id, ack.reason)
