"""What a client session takes and gives: hello's capabilities and the actions.

A driver builds :class:`Capabilities` once (what hello advertises, the join
token among them) and carries out the actions the session returns, in order:
``Send`` a frame, run a ``ComputeRequest``, stop for good on ``Finished``,
``Close`` the socket with a code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compression import codecs
from nn.params import Params
from nn.spec import INIT_SCHEME
from protocol import messages as m
from protocol.limits import LinkLimits
from protocol.shardfile import ShardData


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    """What hello advertises; ``limits`` is what this client asks for (None: server's)."""

    flops: float = 1e9
    cores: int = 1
    memory: int = 0
    platform: str = ""
    limits: LinkLimits | None = None
    #: every codec this build decodes (a parameterised name covers its whole wire id)
    codecs: tuple[str, ...] = field(default_factory=lambda: tuple(codecs.names()))
    #: applies model deltas (task.delta_base)
    deltas: bool = True
    #: builds version 0 from task.init_seed without task.init_scheme: NumPy's PCG64
    #: init of older coordinators (this build's NumPy draws it)
    seeded_init: bool = True
    #: seeded-init schemes it reproduces (hello.init_schemes, docs/protocol.md §12.3)
    init_schemes: tuple[str, ...] = (INIT_SCHEME,)
    #: takes chunks spanning several blocks (and sends them to a server that does)
    spans: bool = True
    #: asks for its next task while it computes, where the server offers that
    prefetch: bool = True
    #: takes its rows as shards named by hash and fetches them (hello.data, §13)
    data: bool = True
    #: returns a layer-split lower task's boundary activations (hello.boundary, §3.3.2)
    boundary: bool = True
    #: the join token hello carries (hello.token, §3.1; None: the job asks for none)
    token: str | None = None
    #: the volunteer's secret key, kept across sessions (hello.volunteer, §3.1; credit)
    volunteer: str | None = None
    #: the §12 kernel family its driver computes with (hello.kernel, §3.1; "": unknown);
    #: the reference drivers compute with client.compute (``client.compute.KERNEL``)
    kernel: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Send:
    """Send ``frame`` (``message`` encoded) to the server now."""

    message: m.Message
    frame: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeRequest:
    """Run ``task`` from ``params`` (read-only: the session's cached model), then
    call ``compute_done(request_id, ...)``."""

    request_id: int
    task: m.Task
    params: Params
    #: the task's shard when it names one (``task.data``), else None
    data: ShardData | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Finished:
    """The job is over (or this client cannot take part): close, do not reconnect.
    ``reason``: why (a finished bye's ``detail``, e.g. ``max_versions``)."""

    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Close:
    """Close the websocket with ``code`` (4000 + error code, §7) after the sends
    before it; then call ``connection_lost``."""

    code: int
    reason: str


Action = Send | ComputeRequest | Finished | Close
