"""Coordinator load: many websocket clients on loopback against one coordinator process.

Load clients run in separate processes (``--workers``, asyncio + websockets,
many connections each). Each client says hello and heartbeats every
``--heartbeat`` seconds (random phase). Two windows: first heartbeats only
(tasks are held, not answered): connections held and heartbeat round-trip
p50/p99, measured on the load client's clock via the coordinator's echo; then
every client takes trivial tasks, answering each at once with a zero update (no
compute), so a round-trip is task (+ model chunks) -> result + chunks -> ack:
acknowledged task round-trips per second. The windows of all load processes
start together, once every client is connected.

The generator runs on the same cores as the coordinator, so each row also says
where the CPU went, in CPU seconds per wall second (1.0 = one core) per window:
the coordinator process and its ``net`` (event loop) and ``core`` threads, read
from /proc, and all load processes together; plus the coordinator's CPU per
acknowledged round trip. On a shared machine the coordinator gets only its
share of the cores; compare runs taken in the same minutes.

``--digits`` also records the wall time to 0.95 test accuracy on digits with
8 local clients (threads of this process, via ``crowdgrad.serve``),
decentral-sync, 10 local steps of batch 16 — the set-up Flower 1.41's FedAvg
simulation needs 14.3 s and 19 rounds for on this kind of machine.

    .venv/bin/python benchmarks/coordinator_load.py [--clients 100,1000[,10000]] [--json]
        [--seconds 5] [--workers 2] [--digits]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing as mp
import os
import resource
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

# Run as a script, this file's folder is sys.path[0]; benchmarks/compression.py
# would shadow the ``compression`` package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import msgpack  # noqa: E402
import numpy as np  # noqa: E402

from protocol import messages as m  # noqa: E402

TINY = [64, 2, 10]  # 160 parameters: frames stay tiny, the coordinator's overhead shows


# -- load worker (a separate process) ----------------------------------------------------
#
# The generator shares the machine's cores with the coordinator, so it is built to be
# cheap: each client is one asyncio.Protocol around websockets' sans-IO ClientProtocol
# (no reader task, keepalive task or lock per connection), frames are peeked with a plain
# msgpack unpack, and one timer per process sends every client's heartbeats in phase
# buckets instead of one sleeping task per client.

HB_BUCKETS = 100  # heartbeat phases per interval


class _LoadClient(asyncio.Protocol):
    """One load client: hello, echo-timed heartbeats, and (once ``w.go``) answers each
    task at once with the zero update."""

    __slots__ = ("fut", "held", "i", "open", "pending", "seq", "task", "tr", "w", "ws")

    def __init__(self, w: _Worker, i: int) -> None:
        from websockets.client import ClientProtocol

        self.w, self.i = w, i
        self.ws = ClientProtocol(w.uri, max_size=None)
        self.tr: asyncio.Transport | None = None
        self.fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.open = False
        self.seq = 0
        self.pending = 0  # model chunks still to come for ``task``
        self.task: dict[str, Any] | None = None
        self.held: dict[str, Any] | None = None  # a ready task, before ``go``

    def _flush(self) -> None:
        assert self.tr is not None
        data = self.ws.data_to_send()
        if data:
            self.tr.write(b"".join(data))

    def send(self, frame: bytes) -> None:
        if self.open:
            self.ws.send_binary(frame)
            self._flush()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tr = transport  # type: ignore[assignment]
        self.ws.send_request(self.ws.connect())
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.open and not self.w.stop:
            self.w.dropped += 1
        if not self.fut.done():
            self.fut.set_exception(ConnectionError("closed during the handshake"))
        self.open = False

    def data_received(self, data: bytes) -> None:
        from websockets.frames import Opcode
        from websockets.http11 import Response

        self.ws.receive_data(data)
        for event in self.ws.events_received():
            if isinstance(event, Response):
                if event.status_code == 101 and self.ws.handshake_exc is None:
                    self.open = True
                    self.w.connected += 1
                    self.send(self.w.hello(self.i))
                    self.fut.set_result(None)
                elif not self.fut.done():
                    self.fut.set_exception(ConnectionError(f"handshake: {event.status_code}"))
            elif event.opcode is Opcode.BINARY:
                self._frame(event.data)
        self._flush()  # pongs and close replies

    def _frame(self, frame: bytes) -> None:
        w = self.w
        msg = msgpack.unpackb(frame, raw=False)
        kind = msg["type"]
        now = time.monotonic()
        if kind == "heartbeat":
            if msg.get("echo") is not None and w.hb_from <= now < w.hb_until:
                w.rtts.append(now - msg["echo"])
            return
        ready = None
        if kind == "task":
            self.task = msg
            if msg.get("base_version") is not None or msg["num_chunks"] == 0:
                ready = msg
            else:
                self.pending = msg["num_chunks"]
        elif kind == "chunk" and self.task is not None and self.pending:
            self.pending -= 1
            if self.pending == 0:
                ready = self.task
        elif kind == "ack" and w.tasks_from <= now:
            w.acks += 1
        if ready is not None:
            if w.go:
                self.answer(ready)
            else:
                self.held = ready

    def heartbeat(self) -> None:
        self.seq += 1
        self.send(msgpack.packb({"type": "heartbeat", "seq": self.seq, "time": time.monotonic()}))

    def answer(self, task: dict[str, Any]) -> None:
        for frame in self.w.result_frames(task):
            self.send(frame)


#: clients per source address by default: players come from many addresses, and
#: the coordinator admits at most 1,024 open connections and bursts of 500 new
#: sessions per address (coordinator/http/admission.py), limits the load keeps on
PER_ADDRESS = 250


def source_address(i: int, per_address: int) -> str:
    """Client ``i``'s loopback source address: ``per_address`` clients each on
    127.0.x.y (Linux routes all of 127.0.0.0/8 to lo); 0: all on 127.0.0.1."""
    if per_address <= 0:
        return "127.0.0.1"
    j = i // per_address
    return f"127.{1 + j // 62_500}.{j // 250 % 250}.{j % 250 + 2}"


class _Worker:
    """A load process's clients and counters."""

    def __init__(
        self, url: str, first: int, n: int, hb: float, spans: bool = True,
        per_address: int = PER_ADDRESS,
    ) -> None:  # fmt: skip
        from websockets.uri import parse_uri

        from nn.params import Params
        from nn.spec import ModelSpec
        from protocol.chunking import chunk_params

        self.uri = parse_uri(url)
        self.first, self.n, self.hb, self.spans = first, n, hb, spans
        self.per_address = per_address
        spec = ModelSpec(widths=tuple(TINY))
        zero = Params.from_flat(spec, np.zeros(spec.num_params, np.float32))
        chunks = chunk_params(zero, max_message_bytes=1 << 16, transfer="t", spans=spans)
        self.chunk_wires: list[tuple[dict[str, Any], bytes]] = []
        for c in chunks:
            wire = c.to_wire()
            payload = bytes(wire.pop("payload"))
            tail = msgpack.packb("payload") + msgpack.packb(payload, use_bin_type=True)
            self.chunk_wires.append((wire, tail))
        self.result_wire = m.Result(
            task_id="t", model_version=0, num_chunks=len(chunks), compute_seconds=0.001
        ).to_wire()
        probe = {"task_id": "7", "model_version": 3, "kind": "train", "steps": 2, "batch": 4}
        want = m.Result(
            task_id="7",
            model_version=3,
            kind="train",
            num_chunks=len(chunks),
            samples=8,
            steps=2,
            compute_seconds=0.001,
        )
        assert self.result_frames(probe) == [m.encode(want)] + [
            m.encode(replace(c, transfer="7")) for c in chunks
        ], "load frames differ from protocol.messages.encode"
        inf = float("inf")
        self.connected = self.failed = self.dropped = self.acks = 0
        self.rtts: list[float] = []
        self.hb_from = self.hb_until = self.tasks_from = inf
        self.stop = self.go = False
        self.clients: list[_LoadClient] = []

    def hello(self, i: int) -> bytes:
        return m.encode(m.Hello(client=f"load{i}", flops=1e9, spans=self.spans))

    def result_frames(self, task: dict[str, Any]) -> list[bytes]:
        """The result and its zero-update chunks, packed from wire dicts: the same
        bytes ``m.encode`` gives (checked once in ``__init__``) at a fraction of the
        generator's CPU."""
        tid = task["task_id"]
        res = {**self.result_wire, "task_id": tid, "model_version": task["model_version"]}
        res.update(kind=task.get("kind", "train"), samples=task["steps"] * task["batch"])
        res["steps"] = task["steps"]
        return [msgpack.packb(res, use_bin_type=True)] + [
            self._chunk_frame(wire, tail, tid) for wire, tail in self.chunk_wires
        ]

    @staticmethod
    def _chunk_frame(wire: dict[str, Any], tail: bytes, transfer: str) -> bytes:
        head = bytearray(msgpack.packb({**wire, "transfer": transfer}, use_bin_type=True))
        head[0] += 1  # a fixmap: one more entry, the payload, follows
        return bytes(head) + tail

    async def connect_all(self, concurrency: int = 256) -> None:
        loop = asyncio.get_running_loop()
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with sem:
                c = _LoadClient(self, i)
                try:
                    local = (source_address(i, self.per_address), 0)
                    await loop.create_connection(
                        lambda: c, self.uri.host, self.uri.port, local_addr=local
                    )
                    await asyncio.wait_for(c.fut, 120)
                except (OSError, TimeoutError):  # ConnectionError is an OSError
                    self.failed += 1
                    if c.tr is not None:
                        c.tr.close()
                    return
                self.clients.append(c)

        await asyncio.gather(*(one(self.first + k) for k in range(self.n)))

    async def heartbeats(self) -> None:
        """Every client heartbeats once per ``hb`` at its own phase (its bucket)."""
        step = self.hb / HB_BUCKETS
        t = time.monotonic()
        k = 0
        while not self.stop:
            for c in self.clients[k::HB_BUCKETS]:
                c.heartbeat()
            k = (k + 1) % HB_BUCKETS
            t += step
            await asyncio.sleep(max(0.0, t - time.monotonic()))


async def _worker_main(
    url: str,
    first: int,
    n: int,
    hb: float,
    warm: float,
    secs: float,
    q: Any,
    go: Any,
    spans: bool = True,
    per_address: int = PER_ADDRESS,
) -> None:
    """Connect n clients; once every worker has (``go``), a heartbeat-only window,
    then a tasks window; put the report on ``q``."""
    w = _Worker(url, first, n, hb, spans, per_address)
    marks: dict[str, tuple[float, float]] = {}

    def mark(name: str) -> None:
        marks[name] = (time.monotonic(), time.process_time())

    mark("start")
    beats = asyncio.create_task(w.heartbeats())  # clients join its buckets as they connect
    await w.connect_all()
    mark("connected")
    q.put("connected")
    while not go.is_set():  # the windows of all workers line up
        await asyncio.sleep(0.02)
    await asyncio.sleep(warm)
    mark("hb_from")
    w.hb_from = marks["hb_from"][0]
    w.hb_until = w.hb_from + max(secs, hb)
    await asyncio.sleep(max(secs, hb))
    mark("hb_until")
    held = w.connected - w.dropped
    w.go = True
    for c in w.clients:
        if c.held is not None:
            c.answer(c.held)
            c.held = None
    await asyncio.sleep(warm)
    mark("tasks_from")
    w.tasks_from = marks["tasks_from"][0]
    await asyncio.sleep(secs)
    mark("tasks_until")
    acks = w.acks
    w.stop = True
    beats.cancel()
    for c in w.clients:
        if c.tr is not None:
            c.tr.close()
    await asyncio.sleep(0.2)
    q.put(
        {
            "connected": w.connected,
            "failed": w.failed,
            "dropped": w.dropped,
            "held": held,
            "acks": acks,
            "rtts": w.rtts,
            "marks": marks,
        }
    )


def _worker(*args: Any) -> None:
    """A load process: ``_worker_main(*args)``, which reports through its queue."""
    resource.setrlimit(resource.RLIMIT_NOFILE, _nofile())
    asyncio.run(_worker_main(*args))


def _nofile() -> tuple[int, int]:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (min(hard, 65536), hard)


class _CpuSampler:
    """Samples this process's CPU seconds, and those of its named threads, so the
    coordinator's share of each window can be told apart from the generator's."""

    def __init__(self, period: float = 0.1) -> None:
        self.period = period
        self.samples: list[tuple[float, float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def _run(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        while not self._stop.is_set():
            per: dict[str, float] = {}
            for t in threading.enumerate():
                if t.native_id is None or not t.name.startswith("crowdgrad-"):
                    continue
                try:
                    with open(f"/proc/self/task/{t.native_id}/stat") as f:
                        fields = f.read().rpartition(")")[2].split()
                    per[t.name] = (int(fields[11]) + int(fields[12])) / tick
                except OSError:
                    continue
            self.samples.append((time.monotonic(), time.process_time(), per))
            self._stop.wait(self.period)

    def __enter__(self) -> _CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def share(self, t0: float, t1: float) -> dict[str, float]:
        """CPU used per wall second in [t0, t1]: the process, and per thread."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return {}
        (a, ca, pa), (b, cb, pb) = inside[0], inside[-1]
        out = {"process": (cb - ca) / (b - a)}
        for name in pb:
            if name in pa:
                out[name.removeprefix("crowdgrad-")] = (pb[name] - pa[name]) / (b - a)
        return {k: round(v, 2) for k, v in out.items()}


# -- driver -----------------------------------------------------------------------------


def run_load(
    n: int,
    *,
    workers: int,
    hb: float,
    warm: float,
    secs: float,
    spans: bool = True,
    per_address: int = PER_ADDRESS,
) -> dict[str, Any]:
    from coordinator.core.config import parse_job
    from coordinator.http.server import CrowdServer
    from coordinator.http.serving import BackgroundServer
    from coordinator.runtime.service import CoreService

    job = parse_job(
        {
            "name": "load",
            "model": {"widths": TINY},
            "data": {"shards": 64, "batch": 1},
            "strategy": {"name": "decentral-async", "tau": 1},
            "eval": {"every_versions": 10**9},
            "validation": {"norm_multiple": 1e9},
            "lease": {"heartbeat_interval_s": hb, "heartbeat_timeout_s": 6 * hb + 30},
        }
    )
    service = CoreService(job)
    crowd = CrowdServer(service)
    ctx = mp.get_context("spawn")
    q, go = ctx.Queue(), ctx.Event()
    with BackgroundServer(crowd) as bg, _CpuSampler() as cpu:
        per = [n // workers + (1 if i < n % workers else 0) for i in range(workers)]
        starts = [sum(per[:i]) for i in range(workers)]
        procs = [
            ctx.Process(
                target=_worker, args=(bg.url, s, k, hb, warm, secs, q, go, spans, per_address)
            )
            for s, k in zip(starts, per, strict=True)
            if k
        ]
        for p in procs:
            p.start()
        for _ in procs:
            assert q.get(timeout=900) == "connected"
        go.set()
        results = [q.get(timeout=900) for _ in procs]
        for p in procs:
            p.join(30)
        accepted = service.stats.accepted
    rtts = np.array([r for res in results for r in res["rtts"]]) * 1e3
    marks = [r["marks"] for r in results]

    def window(a: str, b: str) -> tuple[float, float]:
        return max(mk[a][0] for mk in marks), min(mk[b][0] for mk in marks)

    def gen_cpu(a: str, b: str) -> float:
        """Generator CPU seconds per wall second, all load processes together."""
        return round(sum((mk[b][1] - mk[a][1]) / (mk[b][0] - mk[a][0]) for mk in marks), 2)

    t0, t1 = window("tasks_from", "tasks_until")
    acks = sum(r["acks"] for r in results)
    rate = acks / (t1 - t0)
    task_cpu = cpu.share(t0, t1)
    return {
        "clients": n,
        "spans": spans,
        "workers": len(procs),
        "connected": sum(r["connected"] for r in results),
        "held": sum(r["held"] for r in results),  # at the end of the heartbeat window
        "failed": sum(r["failed"] for r in results),
        "connect_s": round(max(mk["connected"][0] - mk["start"][0] for mk in marks), 2),
        "heartbeats": int(rtts.size),
        "heartbeat_p50_ms": round(float(np.percentile(rtts, 50)), 2) if rtts.size else None,
        "heartbeat_p99_ms": round(float(np.percentile(rtts, 99)), 2) if rtts.size else None,
        "task_round_trips_per_s": round(rate, 1),
        # the coordinator process's CPU per acknowledged round trip (heartbeats included)
        "coordinator_cpu_ms_per_round_trip": (
            round(1e3 * task_cpu["process"] / rate, 3) if rate and task_cpu else None
        ),
        "accepted_total": accepted,
        # CPU seconds per wall second (1.0 = one core busy) in each window
        "cpu_heartbeat_window": {
            "coordinator": cpu.share(*window("hb_from", "hb_until")),
            "generator": gen_cpu("hb_from", "hb_until"),
        },
        "cpu_task_window": {
            "coordinator": task_cpu,
            "generator": gen_cpu("tasks_from", "tasks_until"),
        },
        "cpu_connect": {
            "coordinator": cpu.share(*window("start", "connected")),
            "generator": gen_cpu("start", "connected"),
        },
        "server_max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def run_digits() -> dict[str, Any]:
    from crowdgrad.api import serve
    from nn.data import load_digits
    from nn.spec import ModelSpec
    from nn.train import evaluate

    ds = load_digits(seed=0)
    spec = ModelSpec(widths=(64, 128, 10))
    t0 = time.perf_counter()
    params = serve(
        spec,
        ds,
        clients=8,
        strategy="decentral-sync",
        tau=10,
        batch=16,
        lr=0.1,
        target_accuracy=0.95,
        overrides={"strategy": {"clients_per_round": 8}, "eval": {"every_versions": 1}},
    )
    wall = time.perf_counter() - t0
    acc = evaluate(params, ds.X_test, ds.y_test).accuracy
    return {
        "digits_wall_s": round(wall, 2),
        "digits_accuracy": round(acc, 4),
        "flower_fedavg_s": 14.3,
        "speedup_vs_flower": round(14.3 / wall, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--clients", default="100,1000", help="comma-separated client counts")
    ap.add_argument("--workers", type=int, default=2, help="load processes")
    ap.add_argument("--heartbeat", type=float, default=5.0, help="seconds between heartbeats")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    ap.add_argument("--seconds", type=float, default=5.0, help="measurement window")
    ap.add_argument("--digits", action="store_true", help="also time digits to 0.95")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--per-address",
        type=int,
        default=PER_ADDRESS,
        help=f"clients per loopback source address (default {PER_ADDRESS}; 0: all from "
        "127.0.0.1, which the per-address admission limits refuse past 1,024)",
    )
    ap.add_argument(
        "--no-spans",
        dest="spans",
        action="store_false",
        help="one chunk per block, as a client without hello.spans sends (4 per transfer)",
    )
    ap.add_argument(
        "--default-gc", action="store_true", help="keep CPython's GC thresholds (not tune_gc)"
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if not args.default_gc:
        # The coordinator runs in this process; tune it as `crowdgrad coordinator`
        # does (the load workers are spawned and keep the defaults).
        from crowdgrad.process import tune_gc, tune_malloc

        tune_malloc()
        tune_gc()
    resource.setrlimit(resource.RLIMIT_NOFILE, _nofile())
    rows = []
    for n in (int(x) for x in args.clients.split(",")):
        rows.append(
            run_load(
                n,
                workers=args.workers,
                hb=args.heartbeat,
                warm=args.warmup,
                secs=args.seconds,
                spans=args.spans,
                per_address=args.per_address,
            )
        )
        if not args.json:
            print(rows[-1], flush=True)
    report: dict[str, Any] = {"load": rows}
    if args.digits:
        report["digits"] = run_digits()
        if not args.json:
            print(report["digits"])
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
