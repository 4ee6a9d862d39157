"""What the coordinator core hands back to its driver: actions and metric events.

Actions are imperatives the driver must carry out (``Send`` a message, ``Close``
a connection, write a ``Checkpoint``); events are past-tense facts for metrics,
logs and the dashboard, which a driver may ignore. Every core method returns one
list holding both, in the order they happened.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from nn.subnet import Subnet
from protocol import messages as m

ClientId = str


# -- actions ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Send:
    """Send ``frame`` (``message`` encoded) to ``client_id`` now; already paced.

    The core encodes each message once (a model version's chunks once for every
    client) and paces on the exact frame size, so drivers send ``frame`` as is.
    """

    client_id: ClientId
    message: Any
    frame: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class Close:
    """Close the client's connection with a protocol close code and a public reason."""

    client_id: ClientId
    code: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """Persist the model at ``version`` now (``Coordinator.state_dict()`` has it)."""

    version: int


# -- events -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientJoined:
    client_id: ClientId
    name: str
    resumed: bool
    now: float
    #: hello.platform: free text, but the volunteer page's worker starts it with
    #: its software's name (its ``name`` is the volunteer's display name)
    platform: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientLeft:
    client_id: ClientId
    reason: str
    now: float


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskLeased:
    """``download`` is how the model went: ``none`` (held), ``full``, ``delta`` or
    ``seed`` (the client built version 0 from the init seed);
    ``download_bytes`` its exact frame bytes, ``task_bytes`` the task frame's
    (shard data, fetched once per client, is ``DataServed``). ``queued``: a prefetch, leased
    behind the task the client still computes. ``replica``: a twin of an older
    task, to check its result (coordinator/core/replication.py)."""

    client_id: ClientId
    task_id: int
    lease_id: int
    version: int
    shard: int
    deadline: float
    now: float
    download: str = "full"
    download_bytes: int = 0
    task_bytes: int = 0
    queued: bool = False
    replica: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseExpired:
    client_id: ClientId
    task_id: int
    lease_id: int
    reissued: bool
    now: float


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskDeclined:
    """A client declined a task (``decline``): its lease ended at once. ``reason`` is
    the client's word; ``reissued``: the strategy leased the task again, else it
    was dropped (an async shard goes back to the front of the queue)."""

    client_id: ClientId
    task_id: int
    lease_id: int
    reason: str
    reissued: bool
    now: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ResultAccepted:
    """``frame_bytes``: the result and its chunk frames as received (exact when the
    driver passes ``nbytes``); ``payload_bytes``: the chunks' encoded payloads.
    ``replica``: the result of a twin (compute spent on checking, not on progress)."""

    client_id: ClientId
    task_id: int
    staleness: int
    version: int
    now: float
    frame_bytes: int = 0
    payload_bytes: int = 0
    replica: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ResultRejected:
    client_id: ClientId
    task_id: int
    reason: str
    now: float

    @property
    def resent(self) -> bool:
        """A result its client sent again (after a reconnect) that was taken already
        (``validation.Reject.DUPLICATE``): no fault of the client's."""
        return self.reason == "duplicate"


@dataclass(frozen=True, slots=True, kw_only=True)
class ResultVerified:
    """Two copies of a task were compared (``client_ids``: the primary's holder, then
    the twin's). ``losers``: the clients whose copy the coordinator's own computation
    of the task proved wrong (empty when ``agreed``); ``inconclusive``: those whose
    copy disagreed with it but could not be proven wrong (replication.judge): not
    used, not struck."""

    task_id: int
    twin_id: int
    client_ids: tuple[ClientId, ClientId]
    agreed: bool
    now: float
    losers: tuple[ClientId, ...] = ()
    inconclusive: tuple[ClientId, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientExcluded:
    """A client was caught disagreeing on ``task_id`` and excluded: ``unverified`` of
    its results had gone in unchecked, ``reverted`` of those were subtracted from
    the model again (the rest are counted only)."""

    client_id: ClientId
    task_id: int
    unverified: int
    reverted: int
    now: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelUpdated:
    """The model moved to ``version``, merging ``contributions`` results."""

    version: int
    contributions: int
    now: float


@dataclass(frozen=True, slots=True, kw_only=True)
class MergedInPlace:
    """Task ``task_id``'s sub-model delta went into the model in place, making
    ``version``: ``params += scale * subnet.expand(update)``. What a driver logs to
    make the result durable without writing the model (coordinator/runtime/journal.py),
    and what ``Coordinator.replay`` applies again after a restart.

    ``wire``: the upload's chunks, when kept; ``update`` is then what they decode
    to, times ``clip`` (the validator's norm clip, 1 when it did not clip) in
    float32: a log may keep the chunks instead of the floats."""

    task_id: int
    version: int
    subnet: Subnet
    update: np.ndarray
    scale: float
    now: float
    wire: tuple[m.Chunk, ...] | None = None
    clip: float = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluated:
    version: int
    loss: float
    accuracy: float
    n: int
    now: float
    #: how long it took, when the evaluator had a timer (the served coordinator)
    seconds: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DataServed:
    """A client fetched a shard: ``nbytes`` of it from ``frame_bytes`` of frames."""

    client_id: ClientId
    sha256: str
    nbytes: int
    frame_bytes: int
    now: float


@dataclass(frozen=True, slots=True, kw_only=True)
class JobFinished:
    version: int
    reason: str
    accuracy: float | None
    now: float
    #: "converged": the version whose parameters the final model took back
    #: (earlystop.py), None when it ended with the model it had
    best_of: int | None = None


Action = Send | Close | Checkpoint
Event = (
    ClientJoined
    | ClientLeft
    | TaskLeased
    | LeaseExpired
    | TaskDeclined
    | ResultAccepted
    | ResultRejected
    | ResultVerified
    | ClientExcluded
    | ModelUpdated
    | MergedInPlace
    | Evaluated
    | DataServed
    | JobFinished
)
Output = Action | Event
