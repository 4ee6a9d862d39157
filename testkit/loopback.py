"""An in-process driver: one Coordinator, N ClientSessions, a virtual clock, no sockets.

Every frame goes through the real wire encoding (``protocol.messages.encode`` /
``decode``), every compute through ``client.compute.run_task``; only the network
and the clock are virtual. A frame arrives ``latency`` seconds after it is sent,
a computation takes ``flops / client_flops`` seconds. Events at equal times run
in the order they were scheduled, so a run is a pure function of its inputs.

Used by the tests (digits under each strategy, reconnect scenarios) and handy
for trying a job file without a server. The simulator (simulations/) is the
full-featured driver; this one stays small on purpose.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from client.compute import ComputeOutput, run_task
from client.session import Capabilities, ClientSession, ComputeRequest, Finished
from client.session import Send as ClientSend
from coordinator.core import events as ev
from coordinator.core.machine import Coordinator
from protocol import messages as m


@dataclass(slots=True)
class LoopClient:
    client_id: str
    session: ClientSession
    flops: float
    online: bool = False
    #: connection counter: frames in flight on a dead connection are discarded
    epoch: int = 0
    finished: bool = False
    computes: int = 0


@dataclass(slots=True)
class Loopback:
    core: Coordinator
    latency: float = 0.001
    tick_interval: float = 0.5
    now: float = 0.0
    clients: dict[str, LoopClient] = field(default_factory=dict)
    outputs: list[ev.Output] = field(default_factory=list)
    #: bytes of the frames sent, by direction and message type (``("down", "chunk")``,
    #: ``("up", "result")``): what the byte counts in events are checked against
    carried: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: called with every core output; return value ignored (for assertions)
    on_output: Callable[[ev.Output], Any] | None = None
    #: per client id, what it uploads instead of its honest result (Byzantine tests)
    lies: dict[str, Callable[[ComputeOutput], ComputeOutput]] = field(default_factory=dict)
    _heap: list[tuple[float, int, str, tuple[Any, ...]]] = field(default_factory=list)
    _seq: itertools.count = field(default_factory=itertools.count)

    # -- scripting -----------------------------------------------------------------

    def add_client(
        self,
        client_id: str,
        *,
        flops: float = 1e9,
        at: float | None = None,
        caps: Capabilities | None = None,
    ) -> None:
        """``caps``: what its hello says (default: this build's, at ``flops``)."""
        caps = caps if caps is not None else Capabilities(flops=flops)
        session = ClientSession(client_id, caps, seed=len(self.clients))
        self.clients[client_id] = LoopClient(client_id, session, flops)
        self.schedule(self.now if at is None else at, "connect", client_id)

    def schedule(self, t: float, kind: str, *args: Any) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, args))

    def drop(self, client_id: str, at: float) -> None:
        """The client's connection dies at ``at`` (both sides notice)."""
        self.schedule(at, "drop", client_id)

    def reconnect(self, client_id: str, at: float) -> None:
        self.schedule(at, "connect", client_id)

    # -- running -------------------------------------------------------------------

    def run(self, *, until: float = float("inf"), max_events: int = 1_000_000) -> int:
        """Run until the job finished, time ``until``, or nothing is left; events run."""
        n = 0
        self.schedule(self.now, "tick")
        while self._heap and n < max_events and self.core.finished is None:
            item = heapq.heappop(self._heap)
            t, _, kind, args = item
            if t > until:
                # Back as it was: a new sequence number would put it behind events
                # scheduled later for the same time (a result behind its chunks).
                heapq.heappush(self._heap, item)
                break
            self.now = max(self.now, t)
            self._step(kind, args)
            n += 1
        return n

    def _step(self, kind: str, args: tuple[Any, ...]) -> None:
        now = self.now
        match kind:
            case "connect":
                c = self.clients[args[0]]
                if c.online or c.finished:
                    return
                c.online = True
                c.epoch += 1
                self._client_actions(c, c.session.start(now))
            case "to_server":
                cid, frame, epoch = args
                c = self.clients[cid]
                if c.online and c.epoch == epoch:
                    msg = m.decode(frame)
                    if isinstance(msg, m.Hello):
                        self._core(self.core.connect(cid, msg, now))
                    else:
                        self._core(self.core.receive(cid, msg, now, nbytes=len(frame)))
            case "to_client":
                cid, frame, epoch = args
                c = self.clients[cid]
                if c.online and c.epoch == epoch:
                    self._client_actions(c, c.session.receive(m.decode(frame), now))
            case "compute":
                cid, request_id, out, started = args
                c = self.clients[cid]
                actions = c.session.compute_done(
                    request_id,
                    out.update,
                    now,
                    loss=out.loss,
                    samples=out.samples,
                    steps=out.steps,
                    compute_seconds=now - started,
                    boundary=out.boundary,
                )
                self._client_actions(c, actions)
            case "drop":
                c = self.clients[args[0]]
                if c.online:
                    c.online = False
                    c.session.connection_lost(now)
                    self._core(self.core.disconnect(c.client_id, now, "connection lost"))
            case "tick":
                self._core(self.core.tick(now))
                for c in self.clients.values():
                    if c.online:
                        self._client_actions(c, c.session.tick(now))
                wake = self.core.next_wakeup()
                nxt = now + self.tick_interval
                if wake is not None and now < wake < nxt:
                    nxt = wake
                if self._heap or any(c.online for c in self.clients.values()):
                    self.schedule(nxt, "tick")
            case _:
                raise ValueError(f"loopback: unknown event {kind!r}")

    def _core(self, outputs: list[ev.Output]) -> None:
        for o in outputs:
            self.outputs.append(o)
            if self.on_output is not None:
                self.on_output(o)
            match o:
                case ev.Send():
                    self.carried["down", o.message.TYPE] += len(o.frame)
                    c = self.clients[o.client_id]
                    self.schedule(
                        self.now + self.latency, "to_client", o.client_id, o.frame, c.epoch
                    )
                case ev.Close():
                    c = self.clients.get(o.client_id)
                    if c is not None and c.online:
                        c.online = False
                        c.session.connection_lost(self.now)
                        if o.code == 1000:
                            c.finished = True
                case _:
                    pass

    def _client_actions(self, c: LoopClient, actions: list[Any]) -> None:
        for a in actions:
            match a:
                case ClientSend():
                    self.carried["up", a.message.TYPE] += len(a.frame)
                    self.schedule(
                        self.now + self.latency, "to_server", c.client_id, a.frame, c.epoch
                    )
                case ComputeRequest():
                    self._compute(c, a)
                case Finished():
                    c.finished = True
                    c.online = False

    def _compute(self, c: LoopClient, req: ComputeRequest) -> None:
        out = run_task(req.task, req.params, req.data)
        lie = self.lies.get(c.client_id)
        if lie is not None:
            out = lie(out)
        c.computes += 1
        flops = req.task.spec.flops_per_sample() * req.task.steps * req.task.batch
        done = self.now + flops / c.flops
        self.schedule(done, "compute", c.client_id, req.request_id, out, self.now)
