"""The in-game client: a game calls ``step(budget_s)`` once per frame, on its own thread.

It starts no thread and never blocks. Each ``step`` does the network without
waiting (connect or reconnect after a backoff, read, feed the session, tick it,
write; client.link), then computes optimizer steps of the task in hand while
they fit in what is left of ``budget_s``, by a per-step estimate measured here;
a finished task's result goes to the session. One optimizer step is the
smallest piece: a step longer than the whole budget runs once the budget of the
frames that ran nothing covers it, and its frame overruns (``stats.overruns``).
Why and how it was measured: docs/client.md, "The in-game client".
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import ssl
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from client.base import FATAL_CLOSE_CODES, MAX_FRAME_BYTES, ClientBase
from client.compute import ComputeOutput, SlicedTask
from client.datacache import MemoryCache, ShardCache
from client.link import TLS_UNTRUSTED, Link, LinkState, WebSocketLink, resolve
from client.session import ClientSession, ComputeRequest, Phase
from nn.data import Dataset
from protocol import messages as m
from protocol.errors import CLOSE_CODES, ErrorCode

log = logging.getLogger(__name__)

#: Seconds a connection may take to open (TCP and websocket handshake).
OPEN_TIMEOUT_S = 10.0
#: Seconds a closing connection waits for the server's close before it is dropped.
CLOSE_TIMEOUT_S = 2.0
#: Share of a core a game is assumed to give when the client advertises its
#: FLOP/s before the coordinator has measured it (a quarter of each frame).
ASSUMED_FRAME_SHARE = 0.25
#: FLOP/s assumed before ``warm_up`` measured this machine
DEFAULT_FLOPS = 1e9
#: Pieces whose median is the per-piece estimate
ESTIMATE_WINDOW = 7


@dataclass(slots=True)
class InGameStats:
    #: ``step`` calls
    frames: int = 0
    connects: int = 0
    #: optimizer steps (pieces) computed, and the clock seconds they took
    steps: int = 0
    compute_s: float = 0.0
    #: tasks computed and handed to the session
    results: int = 0
    #: frames whose ``step`` ran past its budget (a piece longer than the budget,
    #: an estimate that was short, a result to encode)
    overruns: int = 0
    #: the slowest piece's seconds per step
    longest_step_s: float = 0.0


@dataclass(slots=True)
class _Job:
    req: ComputeRequest
    sliced: SlicedTask
    started: float
    prefetch_at: float | None


class InGameClient(ClientBase):
    """One volunteer inside a game loop; call :meth:`step` once per frame.

    ``clock``: seconds, monotonic (tests pass a fake one); it times both the
    session's events and the compute pieces. ``link``: makes a :class:`Link`
    for ``url`` (default: :class:`WebSocketLink`). ``flops``: this machine's
    training FLOP/s at full speed (default: measured by :meth:`warm_up`, else
    ``DEFAULT_FLOPS``); hello advertises ``ASSUMED_FRAME_SHARE`` of it until the
    coordinator has measured this client's own pace. ``ca``: for a ``wss://``
    URL, trust these CA certificates (a self-signed coordinator's) instead of the
    system's store.
    """

    def __init__(
        self,
        url: str,
        *,
        name: str = "ingame",
        token: str | None = None,
        flops: float | None = None,
        seed: int = 0,
        data: Dataset | None = None,
        prefetch: bool = True,
        fetch_data: bool = True,
        cache: ShardCache | None = None,
        clock: Callable[[], float] = time.monotonic,
        link: Callable[[str], Link] | None = None,
        backoff_base: float = 0.25,
        backoff_cap: float = 30.0,
        stop_grace: float = 3.0,
        ca: str | os.PathLike[str] | None = None,
    ) -> None:
        if flops is not None and not flops > 0:
            raise ValueError(f"flops: must be > 0, got {flops!r}")
        super().__init__(
            url,
            token=token,
            seed=seed,
            backoff_base=backoff_base,
            backoff_cap=backoff_cap,
            ca=ca,
            clock=clock,
        )
        self.flops = float(flops) if flops is not None else None
        self.data = data
        self.stop_grace = stop_grace
        if link is None:
            address = resolve(url)
            # made once: loading the system's store takes longer than a frame
            tls = self.tls or (ssl.create_default_context() if url.startswith("wss://") else None)

            def link(u: str) -> Link:
                return WebSocketLink(u, address, max_size=MAX_FRAME_BYTES, tls=tls)

        self._make_link = link
        self._caps = self._capabilities(
            flops=(self.flops or DEFAULT_FLOPS) * ASSUMED_FRAME_SHARE,
            cores=1,
            platform="ingame",
            prefetch=prefetch,
            data=fetch_data,
        )
        self.session: ClientSession = ClientSession(
            name[:64], self._caps, seed=seed, cache=cache if cache is not None else MemoryCache()
        )
        self.stats = InGameStats()
        #: why the client ended (None: still running); ``exit_code`` 0 done, 2 refused
        self.finished: str | None = None
        self.exit_code: int | None = None
        self._link: Link | None = None
        self._link_since = 0.0
        self._closing_at: float | None = None
        self._said_hello = False
        self._welcomed = False
        self._retry_at = -math.inf
        self._job: _Job | None = None
        #: seconds per piece, by (widths, batch, kind): measured, else from FLOP/s
        self._piece_s: dict[tuple[Any, ...], deque[float]] = {}
        #: a finished task not yet given to the session, and what that took last
        self._result: tuple[_Job, ComputeOutput, float] | None = None
        self._handover_s = 0.0
        self._bank = 0.0
        self._stop_at: float | None = None

    # -- public --------------------------------------------------------------------

    def warm_up(self, budget_s: float = 0.2, *, threads: int | None = 1) -> float:
        """Load the compiled kernels and measure FLOP/s (blocks ~``budget_s`` plus
        the kernels' load): call it on the game's thread at a loading screen.

        ``threads``: numba's count for the calling thread and BLAS's for the
        process (``nn.threads.set_threads``; None leaves both alone). One keeps
        the compute on the game's thread (why: docs/client.md, "The in-game
        client")."""
        from client.flops import measure_flops
        from nn.threads import set_threads

        if threads is not None:
            set_threads(threads)
        measured = measure_flops(budget_s=budget_s)
        if self.flops is None:
            self.flops = measured
            if self.session.phase is Phase.NEW:
                self.session.caps = dataclasses.replace(
                    self._caps, flops=measured * ASSUMED_FRAME_SHARE
                )
        return measured

    def step(self, budget_s: float) -> None:
        """One frame's share: network IO without waiting, then compute until
        ``budget_s`` seconds (counted from this call) are spent."""
        if not budget_s >= 0:
            raise ValueError(f"budget_s: must be >= 0, got {budget_s!r}")
        start = self._clock()
        self.stats.frames += 1
        if self.finished is not None:
            self._drain_closing(start)
            return
        self._network(start)
        self._hand_over()
        if self.finished is None:
            self._compute(start + budget_s, budget_s)
            self._maybe_stop()
        if self._link is not None:
            self._link.flush()
        if self._clock() > start + budget_s:
            self.stats.overruns += 1

    def stop(self) -> None:
        """Finish the task in hand if that takes at most ``stop_grace`` seconds of
        frames, else abandon it; then say bye and close. Keep calling ``step``
        until ``finished`` is set."""
        if self._stop_at is None:
            self._stop_at = self._clock() + self.stop_grace
            self.session.wind_down()
            self._maybe_stop()

    def close(self) -> None:
        """Drop the connection now (the game is exiting): no bye, no grace."""
        if self._link is not None:
            self._link.abort()
            self._link = None
        if self.finished is None:
            self.finished, self.exit_code = "closed", 0

    @property
    def computing(self) -> bool:
        """A task is in hand (the next ``step`` will compute)."""
        return self._job is not None

    # -- network -------------------------------------------------------------------

    def _network(self, now: float) -> None:
        link = self._link
        session = self.session
        if link is None:
            if now < self._retry_at:
                return
            self._link = link = self._make_link(self.url)
            self._link_since, self._said_hello, self._welcomed = now, False, False
            self._closing_at = None
        frames = link.poll()
        if link.state is LinkState.OPEN and not self._said_hello:
            self._said_hello = True
            self.stats.connects += 1
            self._do(session.start(now))
        for frame in frames:
            if not self.connected or self.finished:
                break
            msg, actions = self._frame_in(frame, now)
            self._welcomed = self._welcomed or isinstance(msg, m.Welcome)
            self._do(actions)
            if msg is None:  # refused
                break
        if self.finished is not None:
            return
        if link.state is LinkState.CONNECTING and now - self._link_since > OPEN_TIMEOUT_S:
            log.info("connection to %s: no handshake in %.0f s", self.url, OPEN_TIMEOUT_S)
            link.abort()
        if link.state is LinkState.CLOSING:  # our close (a refused frame): wait a while
            self._closing_at = now if self._closing_at is None else self._closing_at
            if now - self._closing_at > CLOSE_TIMEOUT_S:
                link.abort()
        if link.state is LinkState.CLOSED:
            self._link_lost(now, link)
            return
        wake = session.next_wakeup()
        if wake is not None and now >= wake:
            self._do(session.tick(now))
        job = self._job
        if job is not None and job.prefetch_at is not None and now >= job.prefetch_at:
            job.prefetch_at = None
            self._do(session.prefetch(now, job.req.request_id))

    def _link_lost(self, now: float, link: Link) -> None:
        self._link = None
        self._lost()
        code = link.close_code
        if code == TLS_UNTRUSTED:
            self.finished, self.exit_code = "refused: TLS certificate not trusted", 2
            self._job = self._result = None
            return
        if code in FATAL_CLOSE_CODES:
            replaced = code == CLOSE_CODES[ErrorCode.REPLACED]
            why = "replaced by a newer connection" if replaced else "refused"
            log.error("coordinator closed this client for good: close %s (%s)", code, why)
            self.finished, self.exit_code = f"{why}: close {code}", 2
            self._job = self._result = None
            return
        if self._stop_at is not None:
            self.finished, self.exit_code = "stopped", 0
            return
        delay = self.backoff.next(joined=self._welcomed)
        assert delay is not None  # no max_attempts: it never gives up
        self._retry_at = now + delay

    def _drain_closing(self, now: float) -> None:
        """After the end: let the closing handshake finish, or drop it in time."""
        link = self._link
        if link is None:
            return
        link.poll()
        if link.state is not LinkState.CLOSED and now - self._link_since > CLOSE_TIMEOUT_S:
            link.abort()
        if link.state is LinkState.CLOSED:
            self._link = None

    def _end(self, reason: str, code: int, close_reason: str) -> None:
        self.finished, self.exit_code = reason, 0
        self._job = self._result = None
        link = self._link
        if link is not None:
            link.close(code, close_reason)
            self._link_since = self._clock()

    def _maybe_stop(self) -> None:
        if self._stop_at is None or self.finished is not None:
            return
        if self.busy and self._clock() < self._stop_at:
            return
        bye = self._leave()
        link = self._link
        if link is not None and link.state is LinkState.OPEN:
            link.send(bye)
        self._end("stopped", 1000, "bye")

    # -- the session's actions (client.base) ---------------------------------------------

    def _send_frame(self, frame: bytes) -> None:
        if self._link is not None:
            self._link.send(frame)

    def _job_finished(self, reason: str) -> None:
        self._end(reason, 1000, "job finished")

    def _close_link(self, code: int, reason: str) -> None:
        if self._link is not None:
            self._link.close(code, reason)

    # -- compute -------------------------------------------------------------------

    def _start_compute(self, req: ComputeRequest) -> None:
        now = self._clock()
        data = req.data if req.task.data is not None else self.data
        try:
            sliced = SlicedTask(req.task, req.params, data)
        except (ValueError, MemoryError) as exc:
            self._job = None
            self._compute_raised(req, exc)
            return
        delay = self.session.prefetch_delay()
        self._job = _Job(req, sliced, now, None if delay is None else now + delay)

    def _estimate(self, sliced: SlicedTask) -> tuple[tuple[Any, ...], float]:
        """Seconds per piece: the median of the last few measured (one preemption or
        page fault moves it neither way), else the task's FLOPs at ``flops``."""
        t = sliced.task
        key = (t.spec.widths, t.batch, t.kind, 0 if t.kind in ("train", "distill") else t.steps)
        seen = self._piece_s.get(key)
        if not seen:
            return key, sliced.step_flops / (self.flops or DEFAULT_FLOPS)
        return key, statistics.median(seen)

    def _compute(self, deadline: float, budget_s: float) -> None:
        job = self._job
        if job is None:
            return
        if self.session.computing != job.req.request_id:
            self._job = None  # superseded by a new task, or abandoned
            return
        sliced = job.sliced
        ran = False
        while not sliced.finished:
            key, est = self._estimate(sliced)
            left = deadline - self._clock()
            if left >= est > 0:
                # Half of what is left by the estimate: a piece twice as slow as
                # estimated still ends in time, and the clock is read again.
                n = max(1, int(0.5 * left / est))
            elif ran or est <= budget_s:
                break  # the next piece fits a frame: next frame
            elif self._bank + max(left, 0.0) < est:
                # A piece longer than the whole budget: bank this frame's budget
                # and run one piece once the bank covers it.
                self._bank += budget_s
                break
            else:
                n = 1
            self._bank = 0.0
            t0 = self._clock()
            try:
                done = sliced.run(n)
            except (ValueError, MemoryError) as exc:
                self._job = None
                self._compute_raised(job.req, exc)
                return
            spent = self._clock() - t0
            per = spent / max(done, 1)
            self._piece_s.setdefault(key, deque(maxlen=ESTIMATE_WINDOW)).append(per)
            self.stats.steps += done
            self.stats.compute_s += spent
            self.stats.longest_step_s = max(self.stats.longest_step_s, per)
            ran = True
        if sliced.finished:
            self._job = None
            self._result = (job, sliced.output(), self._clock())
            if deadline - self._clock() >= self._handover_s:
                self._hand_over()

    def _hand_over(self) -> None:
        """Give a finished task to the session (encoding its result: a few ms for
        a MB-sized update, so when this frame has no room left it waits for the
        start of the next)."""
        if self._result is None:
            return
        job, out, finished = self._result
        self._result = None
        t0 = self._clock()
        self.stats.results += 1
        self._computed(job.req, out, finished - job.started)
        self._handover_s = self._clock() - t0
