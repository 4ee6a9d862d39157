"""The desktop client: asyncio + websockets driving a ClientSession, compute on a worker thread.

Theory of operation. The event loop owns the socket and the session: every
session call happens on it, with ``now = time.monotonic()``. A ComputeRequest
runs on a one-thread executor (the numba kernels release the GIL), so
heartbeats keep flowing while a task computes; its result comes back to the
loop through the future's callback. The compute thread runs at idle priority
(``--priority idle``, the default: client.priority), so it takes only CPU that
nothing else wants and a game beside it keeps its frames; the IO thread stays
at normal priority, so heartbeats keep flowing. With ``cpu_share < 1`` a train
task also runs in slices of about ``slice_s`` seconds with a sleep of
``(1 - S) / S`` × the slice between them, for people who want their fans quiet.

The connection is retried with exponential backoff and full jitter (AWS
architecture blog, "Exponential Backoff And Jitter"); the session keeps its
resume token, its cached model and any unacknowledged result across
reconnects, and the coordinator applies that result at most once. Close codes
that retrying cannot fix (join token refused, version or codecs not served)
end the client with exit code 2; a ``bye`` saying the job is ``finished`` ends it
with exit code 0, without reconnecting. A task whose compute raises is declined
(the coordinator gives it to another client at once). A frame from the
coordinator that does not decode is answered with ``error`` and a close with
4000 + its error code (docs/protocol.md §7).

Stopping (Ctrl-C, SIGTERM): the task in hand is finished if that takes at most
``stop_grace`` seconds, else abandoned; then ``bye`` and close 1000; exit 0.

What the person sees goes through a reporter (client.report): a sentence when it
joins, a progress line, a sentence for each connection problem (fatal ones, which
retrying cannot fix, end the client with exit code 2) and a summary when it
leaves. Failures retried with backoff are said when they change, and every tenth
attempt.

Why long: one process's IO around the sans-IO session: connect and backoff,
the compute thread, priority, data and cache, the console report and the
CLI; each part is a few small methods over the same connection state.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import platform
import random
import signal
import socket
import ssl
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numba
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from client import priority as prio
from client.compute import ComputeOutput, SlicedTask, run_task
from client.datacache import DiskCache, MemoryCache, ShardCache, default_cache_dir
from client.flops import cached_flops, measure_flops
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
from client.session import Capabilities, ClientSession, Close, ComputeRequest, Finished, Send
from compression import codecs
from nn.data import Dataset
from nn.spec import INIT_SCHEME, ModelSpec
from protocol import messages as m
from protocol.errors import CLOSE_CODES, ErrorCode, ProtocolError

log = logging.getLogger(__name__)

#: the FLOP/s measurement's file in the cache folder, beside the shards
FLOPS_FILE = "flops.json"

#: Close codes after which reconnecting cannot help (after ``REPLACED`` the
#: session lives on in a newer connection; reconnecting would take it back).
FATAL_CLOSE_CODES = frozenset(
    CLOSE_CODES[c]
    for c in (
        ErrorCode.AUTH_FAILED,
        ErrorCode.UNSUPPORTED_VERSION,
        ErrorCode.BAD_FIELD,
        ErrorCode.REPLACED,
    )
)
#: Largest frame accepted from a coordinator (the "unlimited" profile + envelope).
MAX_FRAME_BYTES = 256 * 1024 * 1024 + 64 * 1024


class FatalClose(Exception):
    """The coordinator refused us for a reason retrying cannot fix (the sentence)."""


@dataclass(slots=True)
class ClientStats:
    connects: int = 0
    welcomed: int = 0
    computed: int = 0
    abandoned: int = 0
    last_close: tuple[int, str] | None = None


class DesktopClient:
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
    ) -> None:
        """``priority``: of the compute thread (``idle``: only CPU nothing else
        wants). ``lower_pools``: also lower the BLAS and numba threads native code
        started (client.priority); only for a process this client owns (the CLI),
        never inside someone else's. ``reporter``: where the sentences for a
        person go (default: the log, client.report.LogReporter)."""
        if not 0 < cpu_share <= 1:
            raise ValueError(f"cpu_share: must be in (0, 1], got {cpu_share!r}")
        if not backoff_base > 0 or backoff_cap < backoff_base:
            raise ValueError(
                f"backoff: need 0 < base <= cap, got base {backoff_base!r}, cap {backoff_cap!r}"
            )
        self.url = url
        self.name = name or f"{socket.gethostname()[:40]}-{os.getpid()}"
        self.token = token
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
        self.seed = seed if seed is not None else os.getpid()
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.max_attempts = max_attempts
        self.stop_grace = stop_grace
        self.slice_s = slice_s
        self.seeded_init = seeded_init
        self.prefetch = prefetch
        #: fetched shards, kept across runs (``cache=False``: this run only)
        folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.cache: ShardCache = DiskCache(folder) if cache else MemoryCache()
        #: where the FLOP/s measurement is kept between runs (None: measured each run)
        self.flops_file: Path | None = folder / FLOPS_FILE if cache else None
        self.fetch_data = fetch_data
        #: wss:// trusts these certificates (a self-signed coordinator's) instead of
        #: the system's store
        self.ssl: ssl.SSLContext | None = None
        if ca is not None:
            if not url.startswith("wss://"):
                raise ValueError(f"--ca: {url} is not a wss:// URL")
            try:
                self.ssl = ssl.create_default_context(cafile=os.fspath(ca))
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"--ca {ca}: {exc}") from None
        self.stats = ClientStats()
        self.reporter: Reporter = reporter if reporter is not None else LogReporter()
        self.tally = Tally(started=time.monotonic())
        #: why the client left (the summary's first words), once it has
        self.left: str | None = None
        self._last_problem: str | None = None
        self._spec: ModelSpec | None = None
        self.session: ClientSession | None = None
        self._jitter = random.Random(self.seed)
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
            caps = Capabilities(
                flops=float(self.flops),
                cores=max(1, min(4096, os.cpu_count() or 1)),
                platform=(self.platform_name or platform.platform())[:64],
                codecs=tuple(n for n in codecs.names() if len(n) <= 32)[:32],
                seeded_init=self.seeded_init,
                init_schemes=(INIT_SCHEME,) if self.seeded_init else (),
                prefetch=self.prefetch,
                data=self.fetch_data,
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
        attempt = 0
        while not self._stop.is_set():
            welcomed_before = self.stats.welcomed
            failure: Failure | None = None
            try:
                tls = {} if self.ssl is None else {"ssl": self.ssl}  # wss: system store
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
                if self.session is not None and self.session.phase.value in (
                    "hello_sent",
                    "ready",
                ):
                    self.session.connection_lost(time.monotonic())
            if self._finished:
                return 0
            if failure is not None and failure.fatal:
                self.left = failure.text
                self._problem(failure, 0)
                return 2
            if self.stats.welcomed > welcomed_before:
                attempt = 0
            attempt += 1
            if self.max_attempts is not None and attempt > self.max_attempts:
                last = f" ({failure.text})" if failure is not None else ""
                self.left = f"gave up after {attempt} attempts{last}"
                return 1
            delay = self._jitter.uniform(0, min(self.backoff_cap, self.backoff_base * 2**attempt))
            if failure is not None and not self._stop.is_set():
                self._problem(failure, attempt, delay)
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
            session = self.session
            assert session is not None
            self.tally.bytes_down += len(frame)
            try:
                if isinstance(frame, str):
                    raise ProtocolError(ErrorCode.MALFORMED, "a text frame (binary only)")
                msg = m.decode(frame)
            except ProtocolError as exc:
                log.warning("bad frame from the coordinator: %s", exc)
                for a in session.refuse(exc, time.monotonic()):
                    with contextlib.suppress(ConnectionClosed):
                        if isinstance(a, Send):
                            await ws.send(a.frame)
                        elif isinstance(a, Close):
                            await ws.close(a.code, a.reason)
                return
            if session.phase.value not in ("hello_sent", "ready"):
                return
            if isinstance(msg, m.Welcome):
                self.stats.welcomed += 1
            self._do(session.receive(msg, time.monotonic()))
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
        if session.computing is not None or session.pending is not None:
            self.stats.abandoned += 1
            log.info("stopping: task abandoned")
        session.computing = None  # a slice in progress sees this and stops
        with contextlib.suppress(ConnectionClosed):
            await ws.send(m.encode(m.Bye(reason="client stopping")))
            await ws.close(1000, "bye")
        self._finished = True

    # -- session actions -----------------------------------------------------------

    def _do(self, actions: list[Any]) -> None:
        for a in actions:
            match a:
                case Send():
                    ws = self._ws
                    if ws is not None:
                        self._spawn(self._send(ws, self._with_token(a)))
                case ComputeRequest():
                    self._start_compute(a)
                case Finished():
                    log.info("job finished: %s", a.reason)
                    self._finished = True
                    if self.session is not None and self.session.bye is not None:
                        self.left = f"the job finished ({a.reason})"
                    else:
                        self.left = f"this client cannot take part: {a.reason}"
                case Close():
                    ws = self._ws
                    if ws is not None:
                        self._spawn(ws.close(a.code, a.reason))
        if self._kick is not None:
            self._kick.set()

    def _with_token(self, send: Send) -> bytes:
        # The session's Capabilities carry no join token yet; add it to hello here.
        if self.token is not None and isinstance(send.message, m.Hello):
            return m.encode(dataclasses.replace(send.message, token=self.token))
        return send.frame

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
                log.error("task %s failed: %s", req.task.task_id, exc)
                word = "memory" if isinstance(exc, MemoryError) else "compute"
                reason = f"{word}: {type(exc).__name__}: {exc}"
                self._do(session.compute_failed(req.request_id, reason, time.monotonic()))
                return
            out = f.result()
            if out is None:  # superseded while sliced
                return
            self.stats.computed += 1
            self.tally.tasks += 1
            self._do(
                session.compute_done(
                    req.request_id,
                    out.update,
                    time.monotonic(),
                    loss=out.loss,
                    samples=out.samples,
                    steps=out.steps,
                    compute_seconds=time.monotonic() - started,
                    metrics=out.metrics,
                    boundary=out.boundary,
                )
            )

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


# -- command line ----------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="the coordinator's websocket URL (ws://host:port/ws)")
    p.add_argument("--name", help="shown on the coordinator (default: host-pid)")
    p.add_argument("--token", default=os.environ.get("CROWDGRAD_JOIN_TOKEN"), help="join token")
    p.add_argument(
        "--cpu-share",
        type=float,
        default=1.0,
        help="fraction of one core to use, in (0, 1] (default 1: as fast as possible)",
    )
    p.add_argument(
        "--priority",
        choices=[p.value for p in prio.Priority],
        default=prio.Priority.IDLE.value,
        help="of the compute threads: idle (default: SCHED_IDLE on Linux, the lowest "
        "class elsewhere; only CPU nothing else wants) or normal",
    )
    p.add_argument(
        "--flops",
        type=float,
        help="report this training FLOP/s instead of the start-up measurement (kept "
        "in the cache folder for a day)",
    )
    p.add_argument("--seed", type=int, help="seeds update codecs and jitter (default: pid)")
    p.add_argument("--max-attempts", type=int, help="give up after this many failed connects")
    p.add_argument("--stop-grace", type=float, default=3.0, help="seconds to finish a task")
    p.add_argument(
        "--no-seeded-init",
        dest="seeded_init",
        action="store_false",
        help="download version 0 instead of building it from the job's init seed "
        "(announces no init scheme, docs/protocol.md §12.3)",
    )
    p.add_argument(
        "--no-prefetch",
        dest="prefetch",
        action="store_false",
        help="wait for each task instead of fetching the next one while computing",
    )
    p.add_argument(
        "--cache-dir",
        help="where fetched data shards are kept, one file per sha256, and the FLOP/s "
        "measurement (default: $CROWDGRAD_CACHE_DIR, else $XDG_CACHE_HOME/crowdgrad/data, "
        "else ~/.cache/crowdgrad/data)",
    )
    p.add_argument(
        "--no-cache",
        dest="cache",
        action="store_false",
        help="keep fetched shards in memory only (fetch them again next run) and "
        "measure FLOP/s at every start",
    )
    p.add_argument(
        "--ca",
        metavar="PEM",
        help="for wss:// URLs: trust these CA certificates (e.g. a self-signed "
        "coordinator's) instead of the system's",
    )
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="say only what went wrong (no join, progress or summary lines)",
    )
    p.add_argument(
        "--progress-interval",
        type=float,
        metavar="SECONDS",
        help="seconds between progress lines (default: 1 on a terminal, where the line "
        "updates in place, else 30; 0: none)",
    )
    p.add_argument(
        "--no-data-fetch",
        dest="fetch_data",
        action="store_false",
        help="load the job's built-in dataset on this machine instead of fetching shards "
        "(refused by jobs whose data is a file)",
    )


def client_from_args(args: argparse.Namespace, reporter: Reporter | None = None) -> DesktopClient:
    return DesktopClient(
        args.url,
        name=args.name,
        token=args.token,
        cpu_share=args.cpu_share,
        flops=args.flops,
        seed=args.seed,
        max_attempts=args.max_attempts,
        stop_grace=args.stop_grace,
        seeded_init=args.seeded_init,
        prefetch=args.prefetch,
        cache_dir=args.cache_dir,
        cache=args.cache,
        fetch_data=args.fetch_data,
        ca=args.ca,
        priority=args.priority,
        lower_pools=True,
        reporter=reporter,
    )


async def run_until_signal(client: DesktopClient) -> int:
    """Run ``client`` with SIGINT/SIGTERM wired to a graceful stop."""
    loop = asyncio.get_running_loop()
    for sig, why in ((signal.SIGINT, "stopped (Ctrl-C)"), (signal.SIGTERM, "stopped (SIGTERM)")):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, client.request_stop, why)
    return await client.run()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m client.desktop", description=__doc__)
    add_arguments(p)
    p.add_argument("-v", "--verbose", action="count", default=0)
    args = p.parse_args(argv)
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from crowdgrad.commands.client import run  # the CLI's console (rich)

    try:
        return run(args)
    except ValueError as exc:
        log.error("client: %s", exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
