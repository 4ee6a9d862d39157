"""The desktop client: asyncio + websockets driving a ClientSession, compute on a worker thread.

The event loop owns the socket and the session: every session call happens on
it, with ``now = time.monotonic()``. A ComputeRequest runs on a one-thread
executor at idle priority (client.priority; the numba kernels release the GIL),
so heartbeats keep flowing while a task computes; below ``cpu_share`` 1 a train
task runs in slices with sleeps between them. Reconnects, close codes and the
join token are client.base's. ``run()`` returns the exit code: 0 the job finished
or the client was stopped (the task in hand finished within ``stop_grace``, else
abandoned; then ``bye``), 1 gave up (``max_attempts``), 2 refused. What the
person sees goes to a reporter (client.report); more in docs/client.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numba
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from client import priority as prio
from client.actions import Close, ComputeRequest, Send
from client.base import FATAL_CLOSE_CODES, MAX_FRAME_BYTES, ClientBase
from client.compute import ComputeOutput, SlicedTask, run_task
from client.datacache import DiskCache, MemoryCache, ShardCache, default_cache_dir
from client.flops import cached_flops, measure_flops
from client.identity import new_key, volunteer_key
from client.report import (
    Failure,
    LogReporter,
    Reporter,
    Tally,
    close_failure,
    connect_failure,
    joined_sentence,
    model_sentence,
    progress_line,
    summary,
)
from client.session import ClientSession
from nn.data import Dataset
from nn.spec import ModelSpec
from protocol import messages as m
from protocol.limits import LinkLimits, data_cap
from protocol.volunteer import check_name

log = logging.getLogger(__name__)

#: the FLOP/s measurement's file in the cache folder, beside the shards
FLOPS_FILE = "flops.json"


class FatalClose(Exception):
    """The coordinator refused us for a reason retrying cannot fix (the sentence)."""


@dataclass(slots=True)
class ClientStats:
    connects: int = 0
    welcomed: int = 0
    computed: int = 0
    abandoned: int = 0
    last_close: tuple[int, str] | None = None


class DesktopClient(ClientBase):
    """One volunteer: ``await DesktopClient(url).run()`` returns an exit code."""

    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        token: str | None = None,
        cpu_share: float = 1.0,
        data: Dataset | None = None,
        flops: float | None = None,
        seed: int | None = None,
        backoff_base: float = 0.25,
        backoff_cap: float = 30.0,
        max_attempts: int | None = None,
        stop_grace: float = 3.0,
        slice_s: float = 0.01,
        seeded_init: bool = True,
        prefetch: bool = True,
        cache_dir: str | os.PathLike[str] | None = None,
        cache: bool = True,
        fetch_data: bool = True,
        ca: str | os.PathLike[str] | None = None,
        priority: prio.Priority | str = prio.Priority.IDLE,
        lower_pools: bool = False,
        reporter: Reporter | None = None,
        platform_name: str | None = None,
        volunteer: bool | str = True,
        max_mb_per_hour: float | None = None,
    ) -> None:
        """``priority``: of the compute thread (``idle``: only CPU nothing else
        wants). ``lower_pools``: also lower the BLAS and numba threads native code
        started (client.priority); only for a process this client owns (the CLI),
        never inside someone else's. ``reporter``: where the sentences for a
        person go (default: the log, client.report.LogReporter). ``volunteer``: the
        key credit is kept under (True: the one kept in the cache folder, made on
        first use; False: none, anonymous). ``max_mb_per_hour``: the volunteer's
        data cap, both directions together (protocol.limits.data_cap), asked for
        in hello; None: the coordinator's link."""
        if not 0 < cpu_share <= 1:
            raise ValueError(f"cpu_share: must be in (0, 1], got {cpu_share!r}")
        #: the limits hello asks for (None: whatever the coordinator grants)
        self.limits: LinkLimits | None = None
        if max_mb_per_hour is not None:
            try:
                self.limits = data_cap(max_mb_per_hour)
            except ValueError as exc:
                raise ValueError(f"max_mb_per_hour: {exc}") from None
        self.seed = seed if seed is not None else os.getpid()
        super().__init__(
            url,
            token=token,
            seed=self.seed,
            backoff_base=backoff_base,
            backoff_cap=backoff_cap,
            max_attempts=max_attempts,
            ca=ca,
            clock=time.monotonic,
        )
        self.name = name or f"{socket.gethostname()[:24]}-{os.getpid()}"
        self.cpu_share = float(cpu_share)
        try:
            self.priority = prio.Priority(priority)
        except ValueError:
            raise ValueError(f"priority: expected normal or idle, got {priority!r}") from None
        self.lower_pools = lower_pools
        #: ``hello.platform`` (default: this OS); an edge coordinator says so here
        self.platform_name = platform_name
        self.data = data
        self.flops = flops
        self.stop_grace = stop_grace
        self.slice_s = slice_s
        self.seeded_init = seeded_init
        self.prefetch = prefetch
        #: fetched shards, kept across runs (``cache=False``: this run only)
        folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.cache: ShardCache = DiskCache(folder) if cache else MemoryCache()
        #: where the FLOP/s measurement is kept between runs (None: measured each run)
        self.flops_file: Path | None = folder / FLOPS_FILE if cache else None
        if volunteer is not False:
            # shown beside the credit: the coordinator refuses a name it cannot show
            why = check_name(self.name)
            if why is not None:
                raise ValueError(f"name: {why}")
        if volunteer is True:
            self.volunteer = volunteer_key(folder) if cache else new_key()
        elif volunteer:
            self.volunteer = volunteer
        self.fetch_data = fetch_data
        self.stats = ClientStats()
        self.reporter: Reporter = reporter if reporter is not None else LogReporter()
        self.tally = Tally(started=time.monotonic())
        #: why the client left (the summary's first words), once it has
        self.left: str | None = None
        self._last_problem: str | None = None
        self._spec: ModelSpec | None = None
        self._pool = ThreadPoolExecutor(
            1,
            thread_name_prefix="crowdgrad-compute",
            initializer=partial(self._init_compute_thread, numba.get_num_threads()),
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._kick: asyncio.Event | None = None
        self._ws: ClientConnection | None = None
        self._finished = False
        self._tasks: set[asyncio.Future[Any]] = set()

    # -- public --------------------------------------------------------------------

    def request_stop(self, why: str = "stopped") -> None:
        """Finish or abandon the task, say bye, exit (callable from any thread);
        ``why`` goes into the summary."""
        loop = self._loop
        if loop is not None and self._stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._stop_now, why)

    def _measure_flops(self) -> float:
        """This machine's training FLOP/s: kept from an earlier run when it is for
        this machine and under a day old (client/flops.py), else measured (0.2 s)."""
        if self.flops_file is None:
            return measure_flops()
        flops, kept = cached_flops(self.flops_file)
        log.debug("FLOP/s %.3g (%s)", flops, "kept from an earlier run" if kept else "measured")
        return flops

    async def run(self) -> int:
        """Connect, train until the job ends or ``request_stop``; 0 ok, 1 gave up, 2 refused."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._kick = asyncio.Event()
        progress = asyncio.create_task(self._progress())
        code = 1
        try:
            if self.flops is None:
                self.flops = await self._loop.run_in_executor(self._pool, self._measure_flops)
            caps = self._capabilities(
                flops=float(self.flops),
                cores=max(1, min(4096, os.cpu_count() or 1)),
                platform=self.platform_name or platform.platform(),
                seeded_init=self.seeded_init,
                prefetch=self.prefetch,
                data=self.fetch_data,
                limits=self.limits,
            )
            self.session = ClientSession(self.name[:64], caps, seed=self.seed, cache=self.cache)
            code = await self._connect_loop()
            return code
        finally:
            progress.cancel()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._say_goodbye(code)

    def _stop_now(self, why: str) -> None:
        assert self._stop is not None
        if not self._stop.is_set():
            self.left = self.left or why
            self._stop.set()

    def _say_goodbye(self, code: int) -> None:
        """The summary (or, for a client that never joined, why it did not)."""
        why = self.left or ("stopped" if code == 0 else "stopped on an error")
        if self.tally.joined_at is None and code != 0:
            if why != self._last_problem:  # a fatal problem was said already
                self.reporter.problem(why)
            return
        self.reporter.say(summary(self._snapshot(), why, time.monotonic()))

    def _snapshot(self) -> Tally:
        """The tally with what the session counts brought up to date."""
        if self.session is not None:
            self.tally.declined = self.session.declined
        return self.tally

    async def _progress(self) -> None:
        interval = self.reporter.progress_interval
        if not interval > 0:
            return
        while True:
            await asyncio.sleep(interval)
            if self.tally.joined_at is not None:
                self.reporter.progress(progress_line(self._snapshot(), time.monotonic()))

    def _problem(self, failure: Failure, attempt: int, delay: float | None = None) -> None:
        """Say a failure when it differs from the last one said, or every tenth attempt."""
        if failure.text == self._last_problem and attempt % 10:
            return
        self._last_problem = failure.text
        if delay is None:
            self.reporter.problem(failure.text)
        else:
            self.reporter.problem(f"{failure.text}; trying again in {delay:.1f} s")

    # -- connections ---------------------------------------------------------------

    async def _connect_loop(self) -> int:
        assert self._stop is not None
        while not self._stop.is_set():
            welcomed_before = self.stats.welcomed
            failure: Failure | None = None
            try:
                tls = {} if self.tls is None else {"ssl": self.tls}  # wss: system store
                async with connect(
                    self.url, max_size=MAX_FRAME_BYTES, compression=None, open_timeout=10, **tls
                ) as ws:
                    self.stats.connects += 1
                    await self._serve(ws)
                if not self._finished and not self._stop.is_set():  # the coordinator closed it
                    failure = close_failure(*(self.stats.last_close or (None, "")))
            except FatalClose as exc:
                failure = Failure(str(exc), fatal=True)
            except (InvalidURI, OSError, InvalidHandshake, TimeoutError, ConnectionClosed) as exc:
                log.debug("connection to %s failed", self.url, exc_info=True)
                failure = connect_failure(exc, self.url, joined=self.stats.welcomed > 0)
            finally:
                self._ws = None
                self._lost()
            if self._finished:
                return 0
            if failure is not None and failure.fatal:
                self.left = failure.text
                self._problem(failure, 0)
                return 2
            delay = self.backoff.next(joined=self.stats.welcomed > welcomed_before)
            if delay is None:
                last = f" ({failure.text})" if failure is not None else ""
                self.left = f"gave up after {self.backoff.attempt} attempts{last}"
                return 1
            if failure is not None and not self._stop.is_set():
                self._problem(failure, self.backoff.attempt, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
        return 0

    async def _serve(self, ws: ClientConnection) -> None:
        """One connection: hello, then frames in / ticks / compute results until closed."""
        assert self.session is not None and self._stop is not None
        self._ws = ws
        self._do(self.session.start(time.monotonic()))
        reader = asyncio.create_task(self._read(ws))
        ticker = asyncio.create_task(self._tick())
        stopper = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if stopper.done() and not reader.done():
                await self._goodbye(ws)
            if reader.done() and reader.exception() is not None:
                raise reader.exception()  # type: ignore[misc]
        finally:
            for t in (reader, ticker, stopper):
                t.cancel()
            close = ws.close_code
            if close is not None:
                self.stats.last_close = (close, ws.close_reason or "")
                if close in FATAL_CLOSE_CODES:
                    raise FatalClose(close_failure(close, ws.close_reason or "").text)

    async def _read(self, ws: ClientConnection) -> None:
        async for frame in ws:
            self.tally.bytes_down += len(frame)
            if not self.connected:
                return
            msg, actions = self._frame_in(frame, time.monotonic())
            if msg is None:  # refused: the error, then the close, before this connection ends
                for a in actions:
                    with contextlib.suppress(ConnectionClosed):
                        if isinstance(a, Send):
                            await ws.send(a.frame)
                        elif isinstance(a, Close):
                            await ws.close(a.code, a.reason)
                return
            if isinstance(msg, m.Welcome):
                self.stats.welcomed += 1
            self._do(actions)
            self._note(msg)
            if self._finished:
                await ws.close(1000, "job finished")
                return

    def _note(self, msg: m.Message) -> None:
        """Count a message from the coordinator; say a join and a new model."""
        t = self.tally
        match msg:
            case m.Welcome():
                t.joins += 1
                if t.joined_at is None:
                    t.joined_at = time.monotonic()
                self._last_problem = None
                self.reporter.say(
                    joined_sentence(
                        self.url,
                        msg,
                        name=self.name,
                        cpu_share=self.cpu_share,
                        priority=self.priority.value,
                        again=t.joins > 1,
                    )
                )
            case m.Task():
                t.version = msg.model_version
                if msg.spec != self._spec:
                    self._spec = msg.spec
                    self.reporter.say(model_sentence(msg))
            case m.Ack():
                t.ack(msg)

    async def _tick(self) -> None:
        assert self.session is not None and self._kick is not None
        while True:
            wake = self.session.next_wakeup()
            delay = 1.0 if wake is None else max(0.0, wake - time.monotonic())
            self._kick.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), delay)
            self._do(self.session.tick(time.monotonic()))

    async def _goodbye(self, ws: ClientConnection) -> None:
        """Ctrl-C: wait up to stop_grace for the task and its ack, then bye + close."""
        session = self.session
        assert session is not None
        session.wind_down()  # a prefetched task is not started
        deadline = time.monotonic() + self.stop_grace
        while (session.computing is not None or session.pending is not None) and (
            time.monotonic() < deadline
        ):
            await asyncio.sleep(0.05)
        if self.busy:
            self.stats.abandoned += 1
        bye = self._leave()
        with contextlib.suppress(ConnectionClosed):
            await ws.send(bye)
            await ws.close(1000, "bye")
        self._finished = True

    # -- session actions -----------------------------------------------------------

    # -- the session's actions (client.base) ---------------------------------------------

    def _send_frame(self, frame: bytes) -> None:
        ws = self._ws
        if ws is not None:
            self._spawn(self._send(ws, frame))

    def _job_finished(self, reason: str) -> None:
        self._finished = True
        if self.session is not None and self.session.bye is not None:
            self.left = f"the job finished ({reason})"
        else:
            self.left = f"this client cannot take part: {reason}"

    def _close_link(self, code: int, reason: str) -> None:
        ws = self._ws
        if ws is not None:
            self._spawn(ws.close(code, reason))

    def _acted(self) -> None:
        if self._kick is not None:
            self._kick.set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, ws: ClientConnection, frame: bytes) -> None:
        # ws.send keeps the order of calls: frames queue in its write buffer.
        self.tally.bytes_up += len(frame)
        with contextlib.suppress(ConnectionClosed):
            await ws.send(frame)

    def _start_compute(self, req: ComputeRequest) -> None:
        loop = self._loop
        assert loop is not None
        started = time.monotonic()
        fut = loop.run_in_executor(self._pool, self._compute, req)
        # Ask for the next task so its model downloads while this one computes.
        delay = self.session.prefetch_delay() if self.session is not None else None
        prefetch = None if delay is None else loop.call_later(delay, self._prefetch, req)

        def done(f: asyncio.Future[ComputeOutput | None]) -> None:
            if prefetch is not None:
                prefetch.cancel()
            session = self.session
            if f.cancelled() or session is None or session.phase.value == "finished":
                return
            exc = f.exception()
            if exc is not None:
                self._compute_raised(req, exc)
                return
            out = f.result()
            if out is None:  # superseded while sliced
                return
            self.stats.computed += 1
            self.tally.tasks += 1
            self._computed(req, out, time.monotonic() - started)

        fut.add_done_callback(done)

    def _prefetch(self, req: ComputeRequest) -> None:
        session = self.session
        if session is not None and session.phase.value == "ready":
            self._do(session.prefetch(time.monotonic(), req.request_id))

    def _init_compute_thread(self, threads: int) -> None:
        """The compute thread's first act. numba's thread count is per thread (a new
        one starts at ``NUMBA_NUM_THREADS``, every core): take the count of the
        thread that made the client (``--threads``); then lower the priority, before
        numba's pool starts, so that the pool inherits it."""
        numba.set_num_threads(threads)
        prio.apply(self.priority, pools=self.lower_pools)

    def _compute(self, req: ComputeRequest) -> ComputeOutput | None:
        """On the worker thread. Whole task at full share; slices below it."""
        task = req.task
        data = req.data if task.data is not None else self.data
        if self.cpu_share >= 1.0 or task.kind != "train":
            return run_task(task, req.params, data)
        # The same update as at full speed (SlicedTask draws every batch up front).
        sliced = SlicedTask(task, req.params, data)
        k = max(1, int(self.slice_s * float(self.flops or 1e9) / sliced.step_flops))
        pause = (1.0 - self.cpu_share) / self.cpu_share
        while not sliced.finished:
            if self.session is None or self.session.computing != req.request_id:
                return None  # superseded or abandoned
            t0 = time.perf_counter()
            sliced.run(k)
            time.sleep((time.perf_counter() - t0) * pause)
        return sliced.output()
