"""Memory before login: what strangers who never say hello cost a real coordinator.

A ``crowdgrad coordinator`` process (default job, link maximum 64 MiB) and
``--connections`` strangers at once, each from its own address in 127.0.0.0/8 (as
many players behind many addresses; admission stays on): each upgrades to a
websocket, waits until all have, then sends one maximal frame before any hello,
in one of two ways:

- ``cap``: a frame of exactly the pre-hello cap (``PRE_HELLO_MAX_BYTES``, 64 KiB)
  of noise, the largest one the server reads; it answers an error and closes;
- ``over``: the header of a frame of the link's maximum (64 MiB) and its first
  MiB, which the server refuses from the header (close 1009).

The coordinator's RSS is sampled every few ms from /proc: the report gives its
peak and final growth over the idle baseline, and the close codes received
(issue 34's target: ≤ 50 MB for 1,000 connections).

    .venv/bin/python benchmarks/prehello.py [--connections 1000] [--mode cap,over] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.append(str(_HERE.parent))  # testkit: in the checkout, not the wheel

from coordinator.http.wsasgi import PRE_HELLO_MAX_BYTES  # noqa: E402
from testkit.netfuzz import source_address  # noqa: E402
from testkit.soakcheck import rss_mb  # noqa: E402

#: the link's default frame maximum (docs/protocol.md §2)
LINK_MAX = 64 * 1024 * 1024
#: what an ``over`` stranger sends of its frame before the server's close
OVER_SENT = 1024 * 1024


async def stranger(i: int, port: int, mode: str, ready: asyncio.Barrier) -> str:
    """One connection: upgrade, wait for the others, send the frame, read the close."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, local_addr=(source_address(i), 0)
    )
    try:
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            (
                f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b" ", 2)[1].decode()
        await ready.wait()
        if status != "101":
            return f"http {status}"
        length = PRE_HELLO_MAX_BYTES if mode == "cap" else LINK_MAX
        # masked with a zero key, so the payload goes as is
        writer.write(bytes([0x82, 0x80 | 127]) + struct.pack("!Q", length) + b"\0\0\0\0")
        body = os.urandom(PRE_HELLO_MAX_BYTES) if mode == "cap" else bytes(OVER_SENT)
        writer.write(body)
        with_close = await _close_code(reader)
        return "no close frame" if with_close is None else f"close {with_close}"
    except (OSError, asyncio.IncompleteReadError) as exc:
        return type(exc).__name__
    finally:
        writer.close()


async def _close_code(reader: asyncio.StreamReader) -> int | None:
    """Skip the server's frames (an error, say) to its close frame; its code."""
    while True:
        try:
            b0, b1 = await reader.readexactly(2)
        except asyncio.IncompleteReadError:
            return None
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", await reader.readexactly(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", await reader.readexactly(8))[0]
        payload = await reader.readexactly(n)
        if b0 & 0x0F == 0x8:
            return struct.unpack("!H", payload[:2])[0] if n >= 2 else None


async def crowd(port: int, count: int, mode: str) -> Counter[str]:
    ready = asyncio.Barrier(count)
    got = await asyncio.gather(*(stranger(i, port, mode, ready) for i in range(count)))
    return Counter(got)


def run(count: int, mode: str) -> dict[str, Any]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "NUMBA_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        log = (Path(tmp) / "coordinator.log").open("w+")
        cmd = [sys.executable, "-m", "crowdgrad", "coordinator", "--port", str(port), "--no-store"]
        coord = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            for _ in range(600):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read()
                    break
                except OSError:
                    time.sleep(0.1)
            asyncio.run(crowd(port, 20, mode))  # warm: the paths taken once
            time.sleep(1.0)
            base = rss_mb(coord.pid)
            peak = [base]
            done = threading.Event()

            def sample() -> None:
                while not done.is_set():
                    peak[0] = max(peak[0], rss_mb(coord.pid) or 0.0)
                    done.wait(0.003)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            t0 = time.perf_counter()
            try:
                codes = asyncio.run(crowd(port, count, mode))
            finally:
                done.set()
                sampler.join(10)
            seconds = time.perf_counter() - t0
            time.sleep(2.0)
            after = rss_mb(coord.pid)
            alive = coord.poll() is None
        finally:
            coord.terminate()
            coord.wait(30)
        log.seek(0)
        crashed = "Traceback" in log.read()
    offered = count * (PRE_HELLO_MAX_BYTES if mode == "cap" else LINK_MAX)
    return {
        "mode": mode,
        "connections": count,
        "frame_bytes": PRE_HELLO_MAX_BYTES if mode == "cap" else LINK_MAX,
        "offered_mb": round(offered / 2**20, 1),
        "seconds": round(seconds, 2),
        "rss_mb_base": round(base, 1),
        "rss_mb_peak": round(peak[0], 1),
        "rss_mb_after": round(after, 1),
        "peak_growth_mb": round(peak[0] - base, 1),
        "after_growth_mb": round(after - base, 1),
        "outcomes": dict(codes),
        "still_serving": alive,
        "traceback_in_log": crashed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--mode", default="cap,over", help="cap, over, or both (comma-separated)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    modes = args.mode.split(",")
    if args.connections < 1 or not modes or any(m not in ("cap", "over") for m in modes):
        ap.error("--connections must be >= 1 and --mode one or both of cap, over")
    rows = [run(args.connections, mode) for mode in modes]
    if args.json:
        print(json.dumps({"rows": rows}, indent=2))
        return
    for r in rows:
        print(
            f"{r['mode']:>4}: {r['connections']} strangers, {r['offered_mb']:,.0f} MB offered: "
            f"RSS {r['rss_mb_base']} MB, peak +{r['peak_growth_mb']} MB, after "
            f"+{r['after_growth_mb']} MB in {r['seconds']} s; {r['outcomes']}"
        )


if __name__ == "__main__":
    main()
