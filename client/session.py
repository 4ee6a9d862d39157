"""The client session: the sans-IO mirror of the coordinator core.

Theory of operation. The desktop client, the browser port and the simulator
each own a socket, a clock and a way to compute; this object owns everything
else. The driver calls ``start`` when a connection opens, ``receive`` with each
decoded message, ``tick`` at ``next_wakeup()``, ``connection_lost`` when the
socket dies and ``compute_done`` when a :class:`ComputeRequest` it was handed
has finished (``client.compute.run_task`` does the maths), or ``compute_failed``
when it raised. Outputs are actions: ``Send`` a frame (already paced to the
granted limits), ``ComputeRequest``, ``Finished`` (the job is over: a ``bye``
with reason ``finished``; close and do not reconnect), ``Close`` (close the
socket with this code: ``refuse`` for a server frame that was invalid).

Rules:

- A new task supersedes the one being computed (the server moved on: its lease
  expired or another copy won); a late ``compute_done`` for it is ignored.
- Except a prefetched one: with a server that offers it (``welcome.prefetch``)
  the driver calls ``prefetch`` ``prefetch_delay()`` seconds into a compute, so
  that the next task's model downloads while this one computes and uploads. The
  task that answers is queued behind the running one and starts the moment it
  is done. The delay puts the request one measured download (plus a round
  trip, the first measured from hello to welcome) before the compute is
  expected to end, as measured on the last task: a request any earlier would
  only start the next task from an older model.
- A finished result is kept until the server acknowledges it. If the socket
  dies first, the result waits; after the next ``welcome`` (with the resume
  token) it is sent again, and the server applies it at most once. The next
  task never waits for an ack (a server may hold acks until the result is
  durable, §6), so several results may await theirs: each is kept, matched by
  task id. At most ``MAX_UNACKED``: with that many waiting, the next task waits
  for one of their acks before it computes (back-pressure: a server that holds
  acks for a checkpoint gets results no faster than it commits them), but not
  past half its lease (a strategy may hold acks until more results come); only
  then is the oldest result dropped, and said once per session.
- The model of the last task is cached with its version, so a task that names
  ``base_version`` needs no download, and one that names ``delta_base`` downloads
  only the difference and adds it to the cached copy.
- A task that names its rows by hash (``task.data``, §13) computes once that
  shard is here: from the injected cache, or fetched (``fetch``, answered by
  ``data`` frames; the fetch starts when the task arrives, so a prefetched task's
  shard downloads during the running compute). A fetch cut by a reconnect goes
  on from the bytes already received; a shard is checked against its hash
  before it is cached or used.
- A task this client cannot do (its compute raised, its upload codec is unknown
  here, the model it builds on is not held, its model chunks are refused) is
  declined: with a server that takes it (``welcome.decline``) a ``decline``
  frees the lease at once, else the lease runs out. The next queued task, if
  any, goes on.
- Only a ``bye`` whose reason is ``finished`` ends the session (``Finished``);
  any other ``bye`` is followed by a close and the driver may reconnect.
- Every close this client sends for an error uses ``4000 + code``
  (``protocol.errors.client_close_code``): a browser can send no other.
- A heartbeat echoes the server's last heartbeat ``time`` with ``held``, the
  seconds since it came, so the server measures its round trip too (§3.7); a
  new connection echoes nothing until the server's first heartbeat.
- With ``task.error_feedback`` the session keeps, per chunk of rows, what the
  upload codec dropped and adds it to the same rows of its next result
  (compression.feedback); the residual outlives tasks and reconnects.

Connection phases (transitions table; anything else is the driver's bug)::

    NEW --start--> HELLO_SENT --welcome--> READY --bye--> FINISHED
    HELLO_SENT | READY --connection_lost--> OFFLINE --start--> HELLO_SENT

Why long: the client's whole protocol state machine (handshake, tasks,
downloads, prefetch, acks and resends, pacing), kept in one place as the
spec describes it, so a second client can be checked against one file.
"""

from __future__ import annotations

import enum
import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from client.datacache import MemoryCache, ShardCache
from compression import ErrorFeedback, codecs
from nn.params import Params
from nn.spec import INIT_SCHEME, LEGACY_INIT_SCHEME
from protocol import messages as m
from protocol.checksum import crc32
from protocol.chunking import (
    Block,
    Reassembler,
    chunk_params,
    iter_chunks,
    params_arrays,
    params_layout,
)
from protocol.errors import ProtocolError, client_close_code
from protocol.feedback import feedback_chunks
from protocol.limits import LinkLimits, Pacer
from protocol.outbox import PacedOutbox
from protocol.shardfile import ShardData, ShardError, decode_shard, sha256_hex
from protocol.states import advance_clock, checked_move

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


log = logging.getLogger(__name__)

#: decoded shards a session keeps (a layer-split job sends a new one per upper task)
MAX_HELD_SHARDS = 16


class Phase(enum.Enum):
    NEW = "new"
    HELLO_SENT = "hello_sent"
    READY = "ready"
    OFFLINE = "offline"
    FINISHED = "finished"


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.NEW: frozenset({Phase.HELLO_SENT}),
    Phase.HELLO_SENT: frozenset({Phase.READY, Phase.OFFLINE, Phase.FINISHED}),
    Phase.READY: frozenset({Phase.OFFLINE, Phase.FINISHED}),
    Phase.OFFLINE: frozenset({Phase.HELLO_SENT}),
    Phase.FINISHED: frozenset(),
}


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


@dataclass(slots=True)
class _Fetching:
    """A shard on its way: the bytes so far, and whether a ``fetch`` is out for it."""

    buf: bytearray
    received: int = 0
    requested: bool = False
    size: int | None = None


@dataclass(slots=True)
class _Pending:
    """A finished result awaiting its ack: the result message and its chunks."""

    task_id: str
    messages: list[m.Message]


#: Results kept for resending while their acks are outstanding; with this many,
#: the next task waits for an ack (at most half its lease) before it computes.
MAX_UNACKED = 16


class ClientSession:
    def __init__(
        self,
        name: str,
        capabilities: Capabilities | None = None,
        seed: int = 0,
        *,
        cache: ShardCache | None = None,
    ) -> None:
        self.name = name
        self.caps = capabilities or Capabilities()
        #: shards fetched before (the driver's disk, or memory)
        self.cache: ShardCache = cache if cache is not None else MemoryCache()
        #: decoded shards by hash, and those still arriving
        self.shards: dict[str, ShardData] = {}
        self._fetching: dict[str, _Fetching] = {}
        #: tasks whose model is here and whose shard is not (task ids)
        self._wait_data: set[str] = set()
        #: the server answers ``fetch`` (from welcome)
        self.server_data = False
        #: shard bytes this session received in ``data`` frames
        self.data_bytes = 0
        self.rng = np.random.default_rng(seed)
        self.phase = Phase.NEW
        self.resume_token: str | None = None
        self.limits: LinkLimits | None = None
        #: the server takes result chunks spanning several blocks (from welcome)
        self.server_spans = False
        self.heartbeat_interval = 5.0
        self.model: Params | None = None
        self.model_version: int | None = None
        #: the server answers ``prefetch`` (from welcome) and this client asks
        self.server_prefetch = False
        #: the server takes ``decline`` (from welcome)
        self.server_decline = False
        #: tasks this session declined (or dropped, to a server without decline)
        self.declined = 0
        #: the ``bye`` that finished the job (reason ``finished``), once it came
        self.bye: m.Bye | None = None
        self.task: m.Task | None = None
        #: a prefetched task, queued behind ``task``; its model may still download
        self.next_task: m.Task | None = None
        self._next_ready = False
        #: the task ``prefetch`` asked a successor for (None: none outstanding)
        self._prefetch_for: str | None = None
        #: winding down (``wind_down``): no prefetch, a queued task is not started
        self._winding_down = False
        self.request_id = 0
        self.computing: int | None = None
        #: finished results awaiting their ack, oldest first, by task id
        self.unacked: dict[str, _Pending] = {}
        #: task ids of the newest results the server acked as accepted
        self.accepted: deque[str] = deque(maxlen=MAX_UNACKED)
        #: the task whose compute waits for an ack (MAX_UNACKED results await
        #: theirs), and when it starts anyway (half its lease from then)
        self._ack_wait: m.Task | None = None
        self._ack_wait_until = math.inf
        #: times a task waited for acks, and results dropped without one
        self.ack_waits = 0
        self.results_dropped = 0
        self.rtt: float | None = None
        #: seconds the last model download took, task frame to last chunk
        self.last_download_s: float | None = None
        #: seconds the last compute took (compute_done's compute_seconds)
        self.last_compute_s: float | None = None
        self._download: Reassembler | None = None
        self._download_task: m.Task | None = None
        self._download_started = 0.0
        self._delta_base: int | None = None
        self.feedback: ErrorFeedback | None = None
        #: frames waiting for the link; its pacer comes with welcome's limits
        self._outbox: PacedOutbox[Send] = PacedOutbox()
        self._hb_seq = 0
        #: the server's last heartbeat ``time`` and when it came (this clock): the
        #: next heartbeat echoes it with ``held``, so the server measures its RTT
        self._peer_time: float | None = None
        self._peer_time_at = 0.0
        self._hello_sent = -math.inf
        self._last_sent = -math.inf
        self._now = -math.inf

    # -- driver API ----------------------------------------------------------------

    def start(self, now: float) -> list[Action]:
        """A connection is open: say hello (with the resume token after a reconnect)."""
        self._advance(now)
        self._move(Phase.HELLO_SENT)
        self._outbox = PacedOutbox()
        self._peer_time = None  # this server may run another clock than the last
        hello = m.Hello(
            client=self.name,
            platform=self.caps.platform,
            cores=self.caps.cores,
            memory=self.caps.memory,
            flops=self.caps.flops,
            limits=self.caps.limits,
            codecs=self.caps.codecs,
            resume=self.resume_token,
            deltas=self.caps.deltas,
            seeded_init=self.caps.seeded_init,
            init_schemes=self.caps.init_schemes,
            spans=self.caps.spans,
            data=self.caps.data,
            boundary=self.caps.boundary,
        )
        self._last_sent = self._hello_sent = now
        return [Send(message=hello, frame=m.encode(hello))]

    def receive(self, message: m.Message, now: float) -> list[Action]:
        """A decoded message from the server."""
        self._advance(now)
        out: list[Action] = []
        if self.phase not in (Phase.HELLO_SENT, Phase.READY):
            raise ValueError(f"receive: session is {self.phase.value}, not connected")
        match message:
            case m.Welcome():
                self._on_welcome(message)
            case m.Task():
                self._on_task(message, out)
            case m.Chunk():
                self._on_chunk(message, out)
            case m.Data():
                self._on_data(message, out)
            case m.Ack():
                self.unacked.pop(message.task_id, None)
                if message.accepted:
                    self.accepted.append(message.task_id)
                else:
                    log.info("result %s refused: %s", message.task_id, message.reason)
                self._start_waiting(out)
            case m.Heartbeat():
                self._peer_time, self._peer_time_at = message.time, now
                if message.echo is not None:
                    self.rtt = max(0.0, now - message.echo)
            case m.Bye() if message.finished:
                self._move(Phase.FINISHED)
                self.bye = message
                self.computing = None
                out.append(Finished(reason=message.detail or message.reason))
                return out
            case m.Bye():  # the server ends this session only; the close follows
                log.info("server said bye (%s): reconnecting is allowed", message.reason)
            case m.Error():
                log.warning("server error %d: %s", message.code, message.message)
            case _:
                log.warning("unexpected %s from the server", message.TYPE)
        self._flush(now, out)
        return out

    def compute_done(
        self,
        request_id: int,
        update: np.ndarray,
        now: float,
        *,
        loss: float | None = None,
        samples: int = 0,
        steps: int = 0,
        compute_seconds: float = 0.0,
        metrics: dict[str, float] | None = None,
        boundary: np.ndarray | None = None,
    ) -> list[Action]:
        """The driver finished a ComputeRequest; a superseded one is ignored.
        An ``evaluate`` task uploads no chunks (``update`` is ignored); a task with
        ``boundary`` (§3.3.2) uploads its rows' activations after the update."""
        self._advance(now)
        out: list[Action] = []
        if request_id != self.computing or self.task is None:
            return out
        if self.task.kind != "evaluate" and not np.isfinite(update).all():
            # Training diverged (a learning rate too high for this model): no codec
            # can carry it and the server would refuse it; say so instead.
            return self.compute_failed(request_id, "compute: the update is not finite", now)
        if self.task.boundary is not None and boundary is None:
            return self.compute_failed(request_id, "compute: the task asks for its boundary", now)
        self.computing = None
        self.last_compute_s = max(0.0, compute_seconds)
        task = self.task
        limit = self.limits.max_message_bytes if self.limits else 1 << 20
        target = self.limits.frame_bytes if self.limits else None
        rounding = rounding_rng(task)
        framing: dict[str, Any] = {
            "max_message_bytes": limit,
            "transfer": task.task_id,
            "rng": rounding,
            "target_bytes": target,
            "spans": self.server_spans,
        }
        delta = None
        if task.kind != "evaluate":
            delta = Params.from_flat(
                task.spec, np.ascontiguousarray(update, dtype=np.float32), copy=False
            )
        if delta is None:
            chunks = []
        elif task.error_feedback:
            codec = codecs.get(task.upload_codec)
            if self.feedback is None or self.feedback.codec is not codec:
                self.feedback = ErrorFeedback(codec)
            chunks = feedback_chunks(delta, self.feedback, **framing)
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
        pending = self.unacked[task.task_id] = _Pending(task.task_id, [result, *chunks])
        while len(self.unacked) > MAX_UNACKED:  # only after a wait for acks ran out
            dropped = next(iter(self.unacked))
            del self.unacked[dropped]
            self.results_dropped += 1
            if self.results_dropped == 1:
                log.warning(
                    "result %s: no ack among the last %d within half a lease; not kept "
                    "(later ones are counted, not logged)", dropped, MAX_UNACKED,
                )  # fmt: skip
        if self.phase is Phase.READY:
            self._send_pending(pending)
        self._prefetch_for = None
        if self._winding_down:
            self.next_task, self._next_ready = None, False
        if self.next_task is not None:  # the prefetched task is next
            self.task, ready = self.next_task, self._next_ready
            self.next_task, self._next_ready = None, False
            if ready:
                self._request(out)
        if self.phase is Phase.READY:
            self._flush(now, out)
        return out

    def compute_failed(self, request_id: int, reason: str, now: float) -> list[Action]:
        """The driver's compute of ``request_id`` raised (``reason``: ``compute``,
        ``memory``... optionally ``": "`` and detail): decline the task, go on with a
        queued one. A superseded request is ignored."""
        self._advance(now)
        out: list[Action] = []
        if request_id != self.computing or self.task is None:
            return out
        self.computing = None
        self._decline(self.task, reason, out)
        if self.phase is Phase.READY:
            self._flush(now, out)
        return out

    def refuse(self, exc: ProtocolError, now: float) -> list[Action]:
        """A server frame was invalid: ``error`` naming it, then ``Close`` with
        4000 + its code (a browser can close with no 1xxx code but 1000, §7)."""
        self._advance(now)
        err = m.Error.from_exception(exc)
        return [
            Send(message=err, frame=m.encode(err)),
            Close(code=client_close_code(exc.code), reason=exc.code.name),
        ]

    def wind_down(self) -> None:
        """The client is stopping: finish the running task, start no queued one and
        ask for none (the server reissues a queued task when the client leaves)."""
        self._winding_down = True
        self.next_task, self._next_ready = None, False
        self._ack_wait, self._ack_wait_until = None, math.inf  # not started either

    def prefetch_delay(self) -> float | None:
        """Seconds after the current compute started to call ``prefetch`` (None: do
        not): one download plus a round trip before the compute should end, all as
        measured last time. Before the first compute is measured its time is the
        task's FLOPs at the FLOP/s this client advertised (hello.flops)."""
        if not self.server_prefetch or self._winding_down or self.task is None:
            return None
        compute_s = self.last_compute_s
        if compute_s is None:
            if not self.caps.flops > 0:
                return None
            t = self.task
            compute_s = t.spec.flops_per_sample(train=True) * t.steps * t.batch / self.caps.flops
        lead = (self.last_download_s or 0.0) + (self.rtt or 0.0)
        return max(0.0, compute_s - lead)

    def prefetch(self, now: float, request_id: int | None = None) -> list[Action]:
        """Ask for the next task while this one computes (a no-op when the server
        does not offer it, nothing computes, ``request_id`` is not the running
        compute, or a prefetch is already out or answered)."""
        self._advance(now)
        out: list[Action] = []
        if (
            self.phase is Phase.READY
            and self.server_prefetch
            and not self._winding_down
            and self.computing is not None
            and (request_id is None or request_id == self.computing)
            and self.task is not None
            and self.next_task is None
            and self._prefetch_for is None
        ):
            self._prefetch_for = self.task.task_id
            self._queue(m.Prefetch(task_id=self.task.task_id))
            self._flush(now, out)
        return out

    def connection_lost(self, now: float) -> list[Action]:
        """The socket died; keep the cached model, the running compute, the result."""
        self._advance(now)
        if self.phase in (Phase.HELLO_SENT, Phase.READY):
            self._move(Phase.OFFLINE)
        self._download = None
        self._download_task = None
        for f in self._fetching.values():  # asked again, from where it stopped
            f.requested = False
        # The server ends every lease of a lost connection: a prefetched task is void.
        self.next_task, self._next_ready, self._prefetch_for = None, False, None
        self._outbox.clear()
        return []

    def tick(self, now: float) -> list[Action]:
        """Heartbeats and paced frames."""
        self._advance(now)
        out: list[Action] = []
        # A heartbeat only when nothing is waiting: queued frames prove liveness
        # when they go, and a heartbeat behind them would only add to the queue.
        # The comparison is the very expression next_wakeup returns, so a tick at
        # that time always fires.
        if (
            self.phase is Phase.READY
            and not self._outbox
            and now >= self._last_sent + self.heartbeat_interval
        ):
            self._hb_seq += 1
            peer = self._peer_time
            held = None if peer is None else max(0.0, now - self._peer_time_at)
            self._queue(m.Heartbeat(seq=self._hb_seq, time=now, echo=peer, held=held))
        self._start_waiting(out)
        self._flush(now, out)
        return out

    def next_wakeup(self) -> float | None:
        if self.phase is not Phase.READY:
            return None
        if self._outbox and self._outbox.pacer is not None:
            wake = self._outbox.next_send_time(self._now)
        else:
            wake = self._last_sent + self.heartbeat_interval
        if self._ack_wait is not None:
            wake = min(wake, self._ack_wait_until)
        return wake

    # -- internals -----------------------------------------------------------------

    def _on_welcome(self, msg: m.Welcome) -> None:
        if self.phase is not Phase.HELLO_SENT:
            log.warning("welcome while %s: ignored", self.phase.value)
            return
        self._move(Phase.READY)
        self.resume_token = msg.resume_token or self.resume_token
        self.limits = msg.limits
        self._outbox.pacer = Pacer(msg.limits)
        self.heartbeat_interval = msg.heartbeat_interval
        self.server_spans = msg.spans and self.caps.spans
        self.server_prefetch = msg.prefetch and self.caps.prefetch
        self.server_data = msg.data and self.caps.data
        self.server_decline = msg.decline
        if self.rtt is None:  # hello to welcome is a round trip: the first estimate
            self.rtt = max(0.0, self._now - self._hello_sent)
        for pending in self.unacked.values():
            self._send_pending(pending)

    def _on_task(self, msg: m.Task, out: list[Action]) -> None:
        if (
            self.computing is not None
            and self.task is not None
            and self._prefetch_for == self.task.task_id
        ):
            # The answer to our prefetch: queued behind the running compute.
            self._prefetch_for = None
            self.next_task, self._next_ready = msg, False
        else:  # supersedes whatever ran or waited
            self.task, self.next_task, self._next_ready = msg, None, False
            self.computing = None
            self._prefetch_for = None
        self._download = None
        self._download_task = None
        self._delta_base = msg.delta_base
        try:
            codecs.get(msg.upload_codec)
        except codecs.CodecError:
            self._decline(msg, f"codec: {msg.upload_codec} unknown", out)
            return
        if msg.delta_base is not None and not self._holds(msg.delta_base, msg):
            self._decline(msg, f"model: delta base {msg.delta_base} not held", out)
            return
        self._have_data(msg)  # start its shard's transfer now, beside the model's
        if msg.init_seed is not None:
            model = msg.spec.init_params(
                msg.init_seed, scheme=msg.init_scheme or LEGACY_INIT_SCHEME
            )
            crc = crc32(model.data)
            if crc != msg.init_crc:
                # Another NumPy draws another init: training on it would send
                # updates against a model the coordinator does not have.
                reason = (
                    f"version 0 from init_seed {msg.init_seed} has CRC-32 "
                    f"{crc}, the coordinator's is {msg.init_crc}: this "
                    "client must download it (desktop client: --no-seeded-init)"
                )
                log.error("task %s: %s", msg.task_id, reason)
                out.append(Finished(reason=reason))
                return
            self.model, self.model_version = model, 0
            self._model_ready(msg, out)
            return
        if msg.base_version is not None:
            if not self._holds(msg.base_version, msg):
                self._decline(msg, f"model: base version {msg.base_version} not held", out)
                return
            self._model_ready(msg, out)
            return
        assert msg.model_transfer is not None
        self._download = Reassembler.for_params(
            msg.spec, transfer=msg.model_transfer, total=msg.num_chunks
        )
        self._download_task = msg
        self._download_started = self._now

    def _holds(self, version: int, msg: m.Task) -> bool:
        """Whether the model held is ``version`` of ``msg``'s shape: after a
        sub-model task it is a slice (§3.3.1), never the whole model."""
        return (
            self.model is not None
            and self.model_version == version
            and self.model.spec.widths == msg.spec.widths
        )

    def _on_chunk(self, msg: m.Chunk, out: list[Action]) -> None:
        dl, task = self._download, self._download_task
        if dl is None or msg.transfer != dl.transfer or task is None:
            return  # a chunk of a superseded transfer
        try:
            dl.add(msg)
        except ProtocolError as exc:
            self._decline(task, f"model: chunk refused ({exc.code.name})", out)
            return
        if dl.done:
            self._download = self._download_task = None
            self.last_download_s = self._now - self._download_started
            if self._delta_base is not None:
                assert self.model is not None and self.model_version == self._delta_base
                model = self.model.copy()  # a running compute may still read the old one
                model.add_(dl.params())
                if not model.is_finite():
                    log.warning("model delta made the model non-finite: dropped")
                    self.model = None
                    self.model_version = None
                    return
                self.model = model
            else:
                self.model = dl.params()
            self.model_version = task.model_version
            self._model_ready(task, out)

    def _model_ready(self, task: m.Task, out: list[Action]) -> None:
        """``task``'s model is in ``self.model``: compute it now, or, if it is the
        prefetched one, once the running compute is done; either only once its
        shard is here too."""
        if not self._have_data(task):
            self._wait_data.add(task.task_id)
            return
        self._wait_data.discard(task.task_id)
        if task is self.next_task:
            self._next_ready = True
        elif task is self.task and self.computing is None:
            self._request(out)

    def _request(self, out: list[Action], *, waited: bool = False) -> None:
        """Compute ``self.task`` now, or, with ``MAX_UNACKED`` results awaiting their
        acks, once one comes (``_start_waiting``; ``waited``: it is time anyway)."""
        assert self.task is not None and self.model is not None
        assert self.model_version == self.task.model_version
        if len(self.unacked) >= MAX_UNACKED and not waited:
            if self._ack_wait is not self.task:
                self._ack_wait = self.task
                self._ack_wait_until = self._now + self.task.deadline / 2
                self.ack_waits += 1
                log.debug("task %s waits: %d results await their acks", self.task.task_id,
                          len(self.unacked))  # fmt: skip
            return
        self._ack_wait, self._ack_wait_until = None, math.inf
        self.request_id += 1
        self.computing = self.request_id
        data = None if self.task.data is None else self.shards[self.task.data]
        out.append(
            ComputeRequest(request_id=self.request_id, task=self.task, params=self.model, data=data)
        )

    def _start_waiting(self, out: list[Action]) -> None:
        """Start the task that waits for acks once one came or its wait is over
        (forget it if another task superseded it or it was declined)."""
        task = self._ack_wait
        if task is None:
            return
        if task is not self.task or self.computing is not None:
            self._ack_wait, self._ack_wait_until = None, math.inf
            return
        if len(self.unacked) < MAX_UNACKED or self._now >= self._ack_wait_until:
            self._request(out, waited=True)

    def _have_data(self, task: m.Task) -> bool:
        """Whether the task's shard is here; if not, take it from the cache or ask
        the server for it (once; after a reconnect, from the bytes already in)."""
        sha = task.data
        if sha is None or sha in self.shards:
            return True
        blob = self.cache.get(sha)
        if blob is not None:
            try:
                self._hold(sha, decode_shard(blob))
                return True
            except ShardError as exc:
                log.warning("cached shard %s unusable (%s): fetching it again", sha[:12], exc)
        if not self.server_data:
            log.warning("task %s names shard %s, the server serves none", task.task_id, sha[:12])
            return False
        f = self._fetching.setdefault(sha, _Fetching(bytearray()))
        if not f.requested:
            f.requested = True
            self._queue(m.Fetch(data=sha, offset=f.received))
        return False

    def _on_data(self, msg: m.Data, out: list[Action]) -> None:
        f = self._fetching.get(msg.data)
        if f is None or not f.requested:
            return  # a shard no task waits for any more, or a fetch of an old connection
        if msg.offset != f.received or (f.size is not None and msg.size != f.size):
            log.warning("shard %s: data at %d, expected %d: asking again", msg.data[:12],
                        msg.offset, f.received)  # fmt: skip
            del self._fetching[msg.data]
            self._queue(m.Fetch(data=msg.data))
            self._fetching[msg.data] = _Fetching(bytearray(), requested=True)
            return
        if f.size is None:
            f.size = msg.size
        f.buf += msg.payload
        f.received += len(msg.payload)
        self.data_bytes += len(msg.payload)
        if f.received < msg.size:
            return
        del self._fetching[msg.data]
        blob = bytes(f.buf)
        try:
            if sha256_hex(blob) != msg.data:
                raise ShardError("its bytes do not match its hash")
            shard = decode_shard(blob)
        except ShardError as exc:
            log.warning("shard %s refused: %s", msg.data[:12], exc)
            return  # the waiting task's lease runs out; nothing wrong is computed
        self.cache.put(msg.data, blob)
        self._hold(msg.data, shard)
        for task in (self.task, self.next_task):
            if task is not None and task.data == msg.data and task.task_id in self._wait_data:
                self._model_ready(task, out)

    def _hold(self, sha: str, shard: ShardData) -> None:
        """Keep a decoded shard, and at most ``MAX_HELD_SHARDS``: the oldest go,
        except those the current and the queued task name (a cache has them)."""
        self.shards.pop(sha, None)
        self.shards[sha] = shard
        keep = {t.data for t in (self.task, self.next_task) if t is not None}
        for old in list(self.shards):
            if len(self.shards) <= MAX_HELD_SHARDS:
                break
            if old not in keep:
                del self.shards[old]

    def _decline(self, task: m.Task, reason: str, out: list[Action]) -> None:
        """Give ``task`` up: forget it (a queued task behind it goes on) and, to a
        server that takes it, say ``decline`` so its lease ends now, not at its
        deadline."""
        log.warning("task %s declined: %s", task.task_id, reason)
        self.declined += 1
        self._wait_data.discard(task.task_id)
        if self._download_task is task:
            self._download = self._download_task = None
        if task is self.next_task:
            self.next_task, self._next_ready = None, False
        elif task is self.task:
            self.task, self.computing, self._prefetch_for = None, None, None
            if self.next_task is not None:  # the prefetched task is next
                self.task, ready = self.next_task, self._next_ready
                self.next_task, self._next_ready = None, False
                if ready:
                    self._request(out)
        if self.server_decline and self.phase is Phase.READY:
            self._queue(m.Decline(task_id=task.task_id, reason=reason[:256]))

    @property
    def pending(self) -> _Pending | None:
        """The newest result still awaiting its ack (None: every one is acked)."""
        return next(reversed(self.unacked.values()), None)

    def _send_pending(self, pending: _Pending) -> None:
        for msg in pending.messages:
            self._queue(msg)

    def _queue(self, msg: m.Message) -> None:
        frame = m.encode(msg)
        self._outbox.push(Send(message=msg, frame=frame), len(frame))

    def _flush(self, now: float, out: list[Action]) -> None:
        before = len(out)
        self._outbox.flush(now, out)  # type: ignore[arg-type]
        if len(out) > before:
            self._last_sent = now

    def _move(self, to: Phase) -> None:
        self.phase = checked_move("client session", TRANSITIONS, self.phase, to)

    def _advance(self, now: float) -> None:
        self._now = advance_clock("client session", self._now, now)
