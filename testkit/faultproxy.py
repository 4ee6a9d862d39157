"""A TCP proxy that makes the network between clients and a coordinator hostile.

``FaultProxy`` listens on a port and forwards each connection to ``upstream``,
with what a ``FaultPlan`` asks for: a latency drawn per connection, jitter per
chunk (order kept), an optional bandwidth cap, and at most one fault per
connection drawn from exponential lifetimes: a *drop* (both sides get a FIN), a
*reset* (both get an RST) or a *blackhole* (nothing more passes either way, no
FIN, until a peer gives up). *Partitions* stall every connection at once, new
ones included, for a few seconds. The schedule is a pure function of the seed:
connection k's latency and fault come from ``plan.connection(seed, k)`` and the
partitions from ``plan.partitions(seed)``, so a run's faults can be replayed
(which connection is number k depends on who connects first).

``tap(conn, direction, message)`` is called on the proxy's loop with every small
crowdgrad message read from either side (``"down"``: read from the upstream,
before any delay, so a message the proxy later drops still counts as sent).
``ProxyThread`` runs a proxy on its own loop for synchronous callers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from testkit.wstap import FrameTap

#: ``tap(connection number, "up" | "down", message map)``
Tap = Callable[[int, str, dict[str, Any]], None]

FAULTS = ("drop", "reset", "blackhole")
CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionPlan:
    """What happens to one connection: its one-way latency and its one fault."""

    latency_s: float
    fault: str | None  # one of FAULTS, or None: the connection is left alone
    fault_after_s: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultPlan:
    """Mean lifetimes are seconds of a connection before that fault (None: never)."""

    latency_s: tuple[float, float] = (0.0, 0.0)  # each connection's, drawn uniformly
    jitter_s: float = 0.0  # up to this much more on each chunk, order kept
    drop_after_s: float | None = None
    reset_after_s: float | None = None
    blackhole_after_s: float | None = None
    bandwidth: float | None = None  # bytes/s each way per connection
    partition_every_s: float | None = None  # mean gap between partitions
    partition_s: tuple[float, float] = (2.0, 5.0)
    first_partition_s: float = 0.0  # none before this many seconds

    def __post_init__(self) -> None:
        lo, hi = self.latency_s
        if not 0 <= lo <= hi or self.jitter_s < 0:
            raise ValueError(f"latency_s {self.latency_s!r}, jitter_s {self.jitter_s!r}")
        for name in ("drop_after_s", "reset_after_s", "blackhole_after_s", "partition_every_s"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"{name}: must be > 0 or None, got {v!r}")
        if self.bandwidth is not None and not self.bandwidth > 0:
            raise ValueError(f"bandwidth: must be > 0 or None, got {self.bandwidth!r}")
        if not 0 < self.partition_s[0] <= self.partition_s[1]:
            raise ValueError(f"partition_s: {self.partition_s!r}")

    def connection(self, seed: int, k: int) -> ConnectionPlan:
        rng = random.Random(f"faultproxy:{seed}:conn:{k}")
        latency = rng.uniform(*self.latency_s)
        means = (self.drop_after_s, self.reset_after_s, self.blackhole_after_s)
        pairs = zip(means, FAULTS, strict=True)
        draws = [(rng.expovariate(1 / m), f) for m, f in pairs if m is not None]
        if not draws:
            return ConnectionPlan(latency_s=latency, fault=None, fault_after_s=None)
        after, fault = min(draws)
        return ConnectionPlan(latency_s=latency, fault=fault, fault_after_s=after)

    def partitions(self, seed: int, horizon_s: float) -> list[tuple[float, float]]:
        """(start, seconds) of each partition, from the proxy's start, up to ``horizon_s``."""
        if self.partition_every_s is None:
            return []
        rng = random.Random(f"faultproxy:{seed}:partitions")
        out, t = [], self.first_partition_s
        while True:
            t += rng.uniform(0.5, 1.5) * self.partition_every_s
            if t >= horizon_s:
                return out
            seconds = rng.uniform(*self.partition_s)
            out.append((round(t, 3), round(seconds, 3)))
            t += seconds


@dataclass(frozen=True, slots=True)
class FaultEvent:
    t: float  # seconds since the proxy started
    conn: int  # connection number, -1 for partitions
    kind: str  # connect, refused, drop, reset, blackhole, partition, healed


@dataclass(slots=True)
class _Conn:
    k: int
    plan: ConnectionPlan
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    silent: bool = False  # blackholed
    upstream_eof: bool = False  # the coordinator's side has ended: nothing more from it
    done: asyncio.Event = field(default_factory=asyncio.Event)


class FaultProxy:
    """Use on one asyncio loop: ``await start()``, ``await close()``."""

    def __init__(
        self,
        *,
        upstream: tuple[str, int],
        plan: FaultPlan,
        seed: int,
        horizon_s: float = 24 * 3600.0,
        tap: Tap | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.upstream, self.plan, self.seed, self.tap = upstream, plan, seed, tap
        self.host, self.port = host, port
        self.events: list[FaultEvent] = []
        self.schedule = plan.partitions(seed, horizon_s)
        self.open_upstreams = 0
        self.bytes = {"up": 0, "down": 0}
        self._ids = itertools.count()
        self._conns: dict[int, _Conn] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._t0 = time.monotonic()

    @property
    def partitioned(self) -> bool:
        return not self._flowing.is_set()

    @property
    def upstreams_reading(self) -> int:
        """Upstream connections whose every byte has not yet been read (after a kill
        of the upstream: 0 once the proxy has read all it ever sent)."""
        return sum(1 for c in self._conns.values() if c.upstream and not c.upstream_eof)

    def count(self, kind: str) -> int:
        return sum(1 for e in self.events if e.kind == kind)

    async def start(self) -> None:
        self._t0 = time.monotonic()
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        self._spawn(self._partitions())

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for c in list(self._conns.values()):
            _abort(c.client, rst=False)
            if c.upstream is not None:
                _abort(c.upstream, rst=False)
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _event(self, conn: int, kind: str) -> None:
        self.events.append(FaultEvent(round(time.monotonic() - self._t0, 3), conn, kind))

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _partitions(self) -> None:
        for start, seconds in self.schedule:
            await asyncio.sleep(max(0.0, self._t0 + start - time.monotonic()))
            self._flowing.clear()
            self._event(-1, "partition")
            await asyncio.sleep(seconds)
            self._flowing.set()
            self._event(-1, "healed")

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:  # close() ends it; a cancelled handler is not an error to log
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        with contextlib.suppress(asyncio.CancelledError):
            await self._connection(cr, cw)

    async def _connection(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        k = next(self._ids)
        conn = _Conn(k, self.plan.connection(self.seed, k), cw)
        self._conns[k] = conn
        self._event(k, "connect")
        try:
            await self._flowing.wait()  # a partition holds a new connection too
            try:
                ur, uw = await asyncio.wait_for(asyncio.open_connection(*self.upstream), 10)
            except (OSError, TimeoutError):
                self._event(k, "refused")
                _abort(cw, rst=True)  # as a connect to a dead port: reset
                return
            conn.upstream = uw
            self.open_upstreams += 1
            try:
                await self._relay(conn, cr, ur, uw)
            finally:
                self.open_upstreams -= 1
        finally:
            del self._conns[k]

    async def _relay(self, conn: _Conn, cr: Any, ur: Any, uw: asyncio.StreamWriter) -> None:
        up = self._spawn(self._pump(conn, "up", cr, uw))
        down = self._spawn(self._pump(conn, "down", ur, conn.client))
        fault = self._spawn(self._fault(conn))
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            # one way has ended (EOF passed on, or swallowed by a blackhole): the other
            # gets a while to end too, as long as a peer's keepalive takes to notice
            await asyncio.wait({up, down}, timeout=120.0 if conn.silent else 30.0)
        finally:
            for t in (up, down, fault):
                t.cancel()
            await asyncio.gather(up, down, fault, return_exceptions=True)
            _abort(conn.client, rst=False)
            _abort(uw, rst=False)
            conn.done.set()

    async def _fault(self, conn: _Conn) -> None:
        plan = conn.plan
        if plan.fault is None or plan.fault_after_s is None:
            return
        await asyncio.sleep(plan.fault_after_s)
        self._event(conn.k, plan.fault)
        if plan.fault == "blackhole":
            conn.silent = True
            return
        for w in (conn.client, conn.upstream):
            if w is not None:
                _abort(w, rst=plan.fault == "reset")

    async def _pump(self, conn: _Conn, way: str, src: Any, dst: asyncio.StreamWriter) -> None:
        tap = FrameTap() if self.tap is not None else None
        rng = random.Random(f"faultproxy:{self.seed}:jitter:{conn.k}:{way}")
        queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue(maxsize=64)
        reader = self._spawn(self._read(conn, way, src, queue, tap, rng))
        try:
            await self._write(conn, way, dst, queue)
        finally:
            reader.cancel()

    async def _read(self, conn: _Conn, way: str, src: Any, queue: Any, tap: Any, rng: Any) -> None:
        last, jitter = 0.0, self.plan.jitter_s
        while True:
            try:
                data = await src.read(CHUNK)
            except (ConnectionError, OSError):
                data = b""
            now = time.monotonic()
            if not data:
                if way == "down":
                    conn.upstream_eof = True
                await queue.put((now, None))
                return
            self.bytes[way] += len(data)
            if tap is not None and self.tap is not None:  # blackholed or not: it was sent
                for message in tap.feed(data):
                    self.tap(conn.k, way, message)
            last = max(last, now + conn.plan.latency_s + (rng.uniform(0, jitter) if jitter else 0))
            await queue.put((last, data))

    async def _write(self, conn: _Conn, way: str, dst: asyncio.StreamWriter, queue: Any) -> None:
        bandwidth = self.plan.bandwidth
        while True:
            at, data = await queue.get()
            if (delay := at - time.monotonic()) > 0:
                await asyncio.sleep(delay)
            await self._flowing.wait()
            if conn.silent:  # blackholed: read and forget, pass on nothing, not even EOF
                if data is None:
                    return
                continue
            if data is None:
                with contextlib.suppress(OSError, RuntimeError):
                    if dst.can_write_eof():
                        dst.write_eof()
                return
            for i in range(0, len(data), 16 * 1024 if bandwidth else len(data)):
                piece = data[i : i + 16 * 1024] if bandwidth else data
                try:
                    dst.write(piece)
                    await dst.drain()
                except (ConnectionError, OSError, RuntimeError):
                    return
                if bandwidth:
                    await asyncio.sleep(len(piece) / bandwidth)


def _abort(w: asyncio.StreamWriter, *, rst: bool) -> None:
    """Close a side now: with ``rst``, SO_LINGER 0 makes the kernel send an RST."""
    if w.is_closing() and not rst:
        return
    sock = w.get_extra_info("socket")
    if rst and sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    w.transport.abort()


class ProxyThread:
    """A FaultProxy on its own event loop in a daemon thread; ``with`` or start/stop."""

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="proxy")
        self.proxy: FaultProxy | None = None

    def start(self) -> FaultProxy:
        self._thread.start()

        async def make() -> FaultProxy:
            proxy = FaultProxy(**self._kwargs)
            await proxy.start()
            return proxy

        self.proxy = asyncio.run_coroutine_threadsafe(make(), self.loop).result(10)
        return self.proxy

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the proxy's loop (to read its state consistently)."""

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def stop(self) -> None:
        if self.proxy is not None:
            asyncio.run_coroutine_threadsafe(self.proxy.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
