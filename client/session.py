"""The client session: the sans-IO mirror of the coordinator core.

A driver (client.desktop, client.ingame, the simulator; client/web/src/session.js
is its port) owns a socket, a clock and compute; this object owns the protocol.
The driver calls ``start`` when a connection opens, ``receive`` with each decoded
message, ``tick`` at ``next_wakeup()``, ``connection_lost`` when the socket dies,
``compute_done`` or ``compute_failed`` for each ``ComputeRequest``, and carries
out the returned actions (client.actions) in order. The rules it keeps (tasks
superseded and prefetched, results kept until acked, shards, declines, closes)
are listed in docs/client.md, "The session".

Connection phases (transitions table; anything else is the driver's bug)::

    NEW --start--> HELLO_SENT --welcome--> READY --bye--> FINISHED
    HELLO_SENT | READY --connection_lost--> OFFLINE --start--> HELLO_SENT
"""

from __future__ import annotations

import enum
import logging
import math
from collections import deque

import numpy as np

from client.actions import Action, Capabilities, Close, ComputeRequest, Finished, Send
from client.datacache import MemoryCache, ShardCache
from client.model import HeldModel
from client.results import MAX_UNACKED, Pending, Unacked, feedback_for, result_messages
from client.shards import MAX_HELD_SHARDS, Shards
from compression import ErrorFeedback, codecs
from nn.params import Params
from protocol import messages as m
from protocol.errors import ProtocolError, client_close_code
from protocol.limits import LinkLimits, Pacer
from protocol.outbox import PacedOutbox
from protocol.shardfile import ShardData
from protocol.states import advance_clock, checked_move

#: The vocabulary a driver imports from here (defined in client.actions).
__all__ = [
    "MAX_HELD_SHARDS",
    "MAX_UNACKED",
    "Action",
    "Capabilities",
    "ClientSession",
    "Close",
    "ComputeRequest",
    "Finished",
    "Phase",
    "Send",
]

log = logging.getLogger(__name__)


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
        self._data = Shards(self.cache)
        #: decoded shards by hash (client.shards)
        self.shards: dict[str, ShardData] = self._data.held
        #: tasks whose model is here and whose shard is not (task ids)
        self._wait_data: set[str] = set()
        #: the server answers ``fetch`` (from welcome)
        self.server_data = False
        self.rng = np.random.default_rng(seed)
        self.phase = Phase.NEW
        self.resume_token: str | None = None
        self.limits: LinkLimits | None = None
        #: the server takes result chunks spanning several blocks (from welcome)
        self.server_spans = False
        self.heartbeat_interval = 5.0
        #: the model held and the one on its way (client.model)
        self._model = HeldModel()
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
        self._results = Unacked()
        #: finished results awaiting their ack, oldest first, by task id
        self.unacked: dict[str, Pending] = self._results.by_task
        #: task ids of the newest results the server acked as accepted
        self.accepted: deque[str] = self._results.accepted
        #: the task whose compute waits for an ack (MAX_UNACKED results await
        #: theirs), and when it starts anyway (half its lease from then)
        self._ack_wait: m.Task | None = None
        self._ack_wait_until = math.inf
        #: times a task waited for acks
        self.ack_waits = 0
        self.rtt: float | None = None
        #: seconds the last compute took (compute_done's compute_seconds)
        self.last_compute_s: float | None = None
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
            token=self.caps.token,
            volunteer=self.caps.volunteer,
            kernel=self.caps.kernel,
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
                self._results.ack(message)
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
            # can carry it and the server would refuse it; say so instead, with
            # the word that lets the server lower its tasks' lr (§3.13).
            return self.compute_failed(request_id, f"{m.DIVERGED}: the update is not finite", now)
        if self.task.boundary is not None and boundary is None:
            return self.compute_failed(request_id, "compute: the task asks for its boundary", now)
        self.computing = None
        self.last_compute_s = max(0.0, compute_seconds)
        task = self.task
        self.feedback = feedback_for(task, self.feedback)
        messages = result_messages(
            task,
            update,
            limits=self.limits,
            spans=self.server_spans,
            feedback=self.feedback,
            boundary=boundary,
            loss=loss,
            samples=samples,
            steps=steps,
            compute_seconds=compute_seconds,
            metrics=metrics,
        )
        pending = self._results.keep(task.task_id, messages)
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
        self._model.stop_download()
        self._data.connection_lost()  # each fetch asked again, from where it stopped
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
        self._model.stop_download()
        try:
            codecs.get(msg.upload_codec)
        except codecs.CodecError:
            self._decline(msg, f"codec: {msg.upload_codec} unknown", out)
            return
        if msg.delta_base is not None and not self._model.holds(msg.delta_base, msg.spec):
            self._decline(msg, f"model: delta base {msg.delta_base} not held", out)
            return
        self._have_data(msg)  # start its shard's transfer now, beside the model's
        if msg.init_seed is not None:
            reason = self._model.seed(msg)
            if reason is not None:
                log.error("task %s: %s", msg.task_id, reason)
                out.append(Finished(reason=reason))
                return
            self._model_ready(msg, out)
            return
        if msg.base_version is not None:
            if not self._model.holds(msg.base_version, msg.spec):
                self._decline(msg, f"model: base version {msg.base_version} not held", out)
                return
            self._model_ready(msg, out)
            return
        self._model.download(msg, self._now)

    def _on_chunk(self, msg: m.Chunk, out: list[Action]) -> None:
        task = self._model.downloading
        try:
            ready = self._model.chunk(msg, self._now)
        except ProtocolError as exc:
            assert task is not None
            self._decline(task, f"model: chunk refused ({exc.code.name})", out)
            return
        if ready is not None:
            self._model_ready(ready, out)

    @property
    def model(self) -> Params | None:
        """The model held (the last task's), read-only: a compute may be reading it."""
        return self._model.params

    @property
    def model_version(self) -> int | None:
        return self._model.version

    @property
    def last_download_s(self) -> float | None:
        """Seconds the last model download took, task frame to last chunk."""
        return self._model.last_download_s

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

    @property
    def data_bytes(self) -> int:
        """Shard bytes this session received in ``data`` frames."""
        return self._data.data_bytes

    def _keep(self) -> set[str | None]:
        """The shards of the current and the queued task (never dropped)."""
        return {t.data for t in (self.task, self.next_task) if t is not None}

    def _have_data(self, task: m.Task) -> bool:
        """Whether the task's shard is here; if not, from the cache or fetched."""
        held, fetch = self._data.need(task, self._keep(), served=self.server_data)
        if fetch is not None:
            self._queue(fetch)
        return held

    def _on_data(self, msg: m.Data, out: list[Action]) -> None:
        again, held = self._data.receive(msg, self._keep())
        if again is not None:
            self._queue(again)
        if not held:
            return
        for task in (self.task, self.next_task):
            if task is not None and task.data == msg.data and task.task_id in self._wait_data:
                self._model_ready(task, out)

    def _hold(self, sha: str, shard: ShardData) -> None:
        self._data.hold(sha, shard, self._keep())

    def _decline(self, task: m.Task, reason: str, out: list[Action]) -> None:
        """Give ``task`` up: forget it (a queued task behind it goes on) and, to a
        server that takes it, say ``decline`` so its lease ends now, not at its
        deadline."""
        log.warning("task %s declined: %s", task.task_id, reason)
        self.declined += 1
        self._wait_data.discard(task.task_id)
        if self._model.downloading is task:
            self._model.stop_download()
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
    def results_dropped(self) -> int:
        """Results dropped without an ack (client.results.Unacked)."""
        return self._results.dropped

    @property
    def pending(self) -> Pending | None:
        """The newest result still awaiting its ack (None: every one is acked)."""
        return next(reversed(self.unacked.values()), None)

    def _send_pending(self, pending: Pending) -> None:
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
