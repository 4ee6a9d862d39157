"""Coordinator load: many websocket clients on loopback against one coordinator process.

Load clients run in separate processes (``--workers``, asyncio + websockets,
many connections each). Each client says hello and heartbeats every
``--heartbeat`` seconds (random phase). Two windows: first heartbeats only
(tasks are held, not answered): connections held and heartbeat round-trip
p50/p99, measured on the load client's clock via the coordinator's echo; then
every client takes trivial tasks, answering each at once with a zero update (no
compute), so a round-trip is task (+ model chunk) -> result + chunk -> ack:
acknowledged task round-trips per second.

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
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's folder is sys.path[0]; benchmarks/compression.py
# would shadow the ``compression`` package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import numpy as np  # noqa: E402

TINY = [64, 2, 10]  # 160 parameters: frames stay tiny, the coordinator's overhead shows


# -- load worker (a separate process) ----------------------------------------------------


async def _one_client(url: str, i: int, hb: float, out: dict[str, Any], sem: Any) -> None:
    from websockets.asyncio.client import connect

    from nn.params import Params
    from nn.spec import ModelSpec
    from protocol import messages as m
    from protocol.chunking import chunk_params

    spec = ModelSpec(widths=tuple(TINY))
    zero = Params.from_flat(spec, np.zeros(spec.num_params, np.float32))
    go: asyncio.Event = out["go"]
    try:
        async with sem:
            ws = await connect(
                url, compression=None, open_timeout=120, ping_interval=None, close_timeout=2
            )
    except Exception:
        out["failed"] += 1
        return
    out["connected"] += 1
    held: list[m.Task] = []  # a task whose model has arrived, not answered yet

    async def answer(task: m.Task) -> None:
        chunks = chunk_params(zero, max_message_bytes=1 << 16, transfer=task.task_id)
        res = m.Result(
            task_id=task.task_id,
            model_version=task.model_version,
            kind=task.kind,
            num_chunks=len(chunks),
            samples=task.steps * task.batch,
            steps=task.steps,
            compute_seconds=0.001,
        )
        for msg in (res, *chunks):
            await ws.send(m.encode(msg))

    async def heartbeats() -> None:
        await asyncio.sleep(random.uniform(0, hb))
        seq = 0
        while not out["stop"]:
            seq += 1
            await ws.send(m.encode(m.Heartbeat(seq=seq, time=time.monotonic())))
            await asyncio.sleep(hb)

    async def start_tasks() -> None:
        await go.wait()
        while held:
            await answer(held.pop())

    try:
        await ws.send(m.encode(m.Hello(client=f"load{i}", flops=1e9)))
        helpers = [asyncio.create_task(heartbeats()), asyncio.create_task(start_tasks())]
        pending: dict[str, int] = {}  # model transfer -> chunks still to come
        task: m.Task | None = None
        while not out["stop"]:
            try:
                frame = await asyncio.wait_for(ws.recv(), 0.5)
            except TimeoutError:
                continue
            msg = m.decode(frame)
            now = time.monotonic()
            ready: m.Task | None = None
            if isinstance(msg, m.Heartbeat) and msg.echo is not None:
                if out["hb_from"] <= now < out["hb_until"]:
                    out["rtts"].append(now - msg.echo)
            elif isinstance(msg, m.Task):
                task = msg
                if msg.base_version is not None or msg.num_chunks == 0:
                    ready = msg
                else:
                    pending[msg.model_transfer or ""] = msg.num_chunks
            elif isinstance(msg, m.Chunk) and msg.transfer in pending:
                pending[msg.transfer] -= 1
                if pending[msg.transfer] == 0:
                    del pending[msg.transfer]
                    ready = task
            elif isinstance(msg, m.Ack) and out["tasks_from"] <= now:
                out["acks"] += 1
            if ready is not None:
                if go.is_set():
                    await answer(ready)
                else:
                    held[:] = [ready]
        for h in helpers:
            h.cancel()
    except Exception:
        out["dropped"] += 1
    finally:
        await ws.close()


async def _worker_main(url: str, first: int, n: int, hb: float, warm: float, secs: float) -> dict:
    """Connect n clients; heartbeat-only window; then tasks window; report."""
    inf = float("inf")
    out: dict[str, Any] = {
        "connected": 0,
        "failed": 0,
        "dropped": 0,
        "acks": 0,
        "rtts": [],
        "hb_from": inf,
        "hb_until": inf,
        "tasks_from": inf,
        "stop": False,
        "go": asyncio.Event(),
    }
    sem = asyncio.Semaphore(256)
    t0 = time.monotonic()
    tasks = [asyncio.create_task(_one_client(url, first + i, hb, out, sem)) for i in range(n)]
    while out["connected"] + out["failed"] < n and time.monotonic() - t0 < 300:
        await asyncio.sleep(0.05)
    out["connect_s"] = time.monotonic() - t0
    await asyncio.sleep(warm)
    out["hb_from"] = time.monotonic()
    out["hb_until"] = out["hb_from"] + max(secs, hb)
    await asyncio.sleep(max(secs, hb))
    out["held"] = out["connected"] - out["dropped"]
    out["go"].set()
    await asyncio.sleep(warm)
    out["tasks_from"] = time.monotonic()
    await asyncio.sleep(secs)
    out["tasks_s"] = time.monotonic() - out["tasks_from"]
    acks = out["acks"]
    out["stop"] = True
    await asyncio.wait(tasks, timeout=30)
    out["acks"] = acks
    del out["go"]
    return out


def _worker(url: str, first: int, n: int, hb: float, warm: float, secs: float, q: Any) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, _nofile())
    q.put(asyncio.run(_worker_main(url, first, n, hb, warm, secs)))


def _nofile() -> tuple[int, int]:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (min(hard, 65536), hard)


# -- driver -----------------------------------------------------------------------------


def run_load(n: int, *, workers: int, hb: float, warm: float, secs: float) -> dict[str, Any]:
    from coordinator.config import parse_job
    from coordinator.server import BackgroundServer, CrowdServer
    from coordinator.service import CoreService

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
    q = ctx.Queue()
    with BackgroundServer(crowd) as bg:
        per = [n // workers + (1 if i < n % workers else 0) for i in range(workers)]
        starts = [sum(per[:i]) for i in range(workers)]
        procs = [
            ctx.Process(target=_worker, args=(bg.url, s, k, hb, warm, secs, q))
            for s, k in zip(starts, per, strict=True)
            if k
        ]
        for p in procs:
            p.start()
        results = [q.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(30)
        st = service.stats
        accepted = st.accepted
    rtts = np.array([r for res in results for r in res["rtts"]]) * 1e3
    secs_measured = max(res["tasks_s"] for res in results)
    return {
        "clients": n,
        "workers": len(procs),
        "connected": sum(r["connected"] for r in results),
        "held": sum(r["held"] for r in results),  # at the end of the heartbeat window
        "failed": sum(r["failed"] for r in results),
        "connect_s": round(max(r["connect_s"] for r in results), 2),
        "heartbeats": int(rtts.size),
        "heartbeat_p50_ms": round(float(np.percentile(rtts, 50)), 2) if rtts.size else None,
        "heartbeat_p99_ms": round(float(np.percentile(rtts, 99)), 2) if rtts.size else None,
        "task_round_trips_per_s": round(sum(r["acks"] for r in results) / secs_measured, 1),
        "accepted_total": accepted,
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
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    resource.setrlimit(resource.RLIMIT_NOFILE, _nofile())
    rows = []
    for n in (int(x) for x in args.clients.split(",")):
        rows.append(
            run_load(
                n, workers=args.workers, hb=args.heartbeat, warm=args.warmup, secs=args.seconds
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
