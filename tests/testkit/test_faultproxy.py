"""The fault proxy: a seeded schedule, bytes intact and late, resets, partitions, the tap."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from typing import Any

import msgpack
import pytest

from testkit.faultproxy import FaultPlan, FaultProxy
from testkit.wstap import FrameTap

HANG_GUARD_S = 30.0  # a hang guard, not a claim


def _frame(payload: bytes, *, opcode: int = 0x2, fin: bool = True, mask: bytes = b"") -> bytes:
    """One RFC 6455 frame, built by hand (the tap is tested against the spec, not itself)."""
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | opcode])
    bit = 0x80 if mask else 0
    if n < 126:
        head += bytes([bit | n])
    elif n < 1 << 16:
        head += bytes([bit | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([bit | 127]) + n.to_bytes(8, "big")
    if mask:
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + payload


def test_the_schedule_is_a_function_of_the_seed() -> None:
    plan = FaultPlan(latency_s=(0.01, 0.2), drop_after_s=10, reset_after_s=20,
                     blackhole_after_s=60, partition_every_s=30)  # fmt: skip
    a = [plan.connection(7, k) for k in range(50)]
    assert a == [plan.connection(7, k) for k in range(50)]
    assert a != [plan.connection(8, k) for k in range(50)]
    assert {c.fault for c in a} == {"drop", "reset", "blackhole"}
    assert all(0.01 <= c.latency_s <= 0.2 for c in a)
    parts = plan.partitions(7, 600)
    assert parts == plan.partitions(7, 600) != plan.partitions(8, 600)
    assert len(parts) >= 10 and all(2 <= s <= 5 for _, s in parts)
    assert all(a + s < b for (a, s), (b, _) in itertools.pairwise(parts))
    assert FaultPlan().connection(1, 0).fault is None and FaultPlan().partitions(1, 1e6) == []
    with pytest.raises(ValueError, match="drop_after_s"):
        FaultPlan(drop_after_s=0)


def test_the_tap_reads_messages_out_of_a_websocket_stream_fed_in_pieces() -> None:
    ack = msgpack.packb({"type": "ack", "task_id": "17", "accepted": True, "reason": ""})
    big = msgpack.packb({"type": "chunk", "payload": os.urandom(100_000)})
    hello = msgpack.packb({"type": "hello", "client": "soak-1"})
    down = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"
    down += _frame(big) + _frame(b"\x00", opcode=0x9)  # a model chunk, a ping
    down += _frame(ack[:5], fin=False) + _frame(b"", opcode=0xA) + _frame(ack[5:], opcode=0)
    tap, seen = FrameTap(), []
    for i in range(0, len(down), 7):  # as TCP may cut it
        seen += tap.feed(down[i : i + 7])
    assert seen == [{"type": "ack", "task_id": "17", "accepted": True, "reason": ""}]
    assert (tap.skipped, tap.broken) == (1, "")
    up = FrameTap()
    req = b"GET /ws HTTP/1.1\r\nHost: x\r\n\r\n" + _frame(hello, mask=b"\x01\x02\x03\x04")
    assert up.feed(req) == [{"type": "hello", "client": "soak-1"}]
    plain = FrameTap()
    assert plain.feed(b"HTTP/1.1 200 OK\r\n\r\n" + _frame(ack)) == [] and plain.broken


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def _with_proxy(plan: FaultPlan, body: Any, **kw: Any) -> FaultProxy:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proxy = FaultProxy(upstream=("127.0.0.1", port), plan=plan, seed=3, **kw)
    await proxy.start()
    try:
        await asyncio.wait_for(body(proxy), HANG_GUARD_S)
    finally:
        await proxy.close()
        server.close()
    return proxy


def test_bytes_arrive_intact_in_order_and_no_sooner_than_the_latency() -> None:
    async def body(proxy: FaultProxy) -> None:
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        sent = os.urandom(300_000)
        t0 = time.monotonic()
        w.write(sent)
        await w.drain()
        got = await r.readexactly(len(sent))
        assert got == sent
        assert time.monotonic() - t0 >= 2 * 0.05  # out and back, each at least 50 ms
        w.close()

    proxy = asyncio.run(_with_proxy(FaultPlan(latency_s=(0.05, 0.06), jitter_s=0.01), body))
    assert proxy.bytes == {"up": 300_000, "down": 300_000}


def test_a_reset_reaches_the_client_as_a_reset() -> None:
    async def body(proxy: FaultProxy) -> None:
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        with pytest.raises(ConnectionResetError):
            while True:
                w.write(b"x" * 1000)
                await w.drain()
                await r.read(65536)
                await asyncio.sleep(0.01)

    proxy = asyncio.run(_with_proxy(FaultPlan(reset_after_s=0.2), body))
    assert proxy.count("reset") == 1


def test_a_partition_holds_every_byte_until_it_heals() -> None:
    plan = FaultPlan(partition_every_s=1.0, partition_s=(1.0, 1.5))
    start, seconds = plan.partitions(3, 100)[0]

    async def body(proxy: FaultProxy) -> None:
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        await asyncio.sleep(max(0.0, proxy._t0 + start + 0.2 - time.monotonic()))
        assert proxy.partitioned
        w.write(b"ping")
        await w.drain()
        assert await r.readexactly(4) == b"ping"
        assert time.monotonic() - proxy._t0 >= start + seconds  # not before it healed
        w.close()

    proxy = asyncio.run(_with_proxy(plan, body))
    assert [e.kind for e in proxy.events if e.conn == -1][:2] == ["partition", "healed"]


def test_a_dead_upstream_is_a_refused_connection_and_the_tap_sees_both_ways() -> None:
    seen: list[tuple[str, Any]] = []
    ack = msgpack.packb({"type": "ack", "task_id": "3", "accepted": False, "reason": "stale"})

    async def body(proxy: FaultProxy) -> None:
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        w.write(b"GET /ws HTTP/1.1\r\n\r\n" + _frame(ack, mask=b"abcd"))
        await w.drain()
        await r.readexactly(20 + 2 + 4 + len(ack))  # echoed: the tap reads it as sent down
        w.close()

    def tap(conn: int, way: str, message: dict[str, Any]) -> None:
        seen.append((way, message["task_id"]))

    asyncio.run(_with_proxy(FaultPlan(), body, tap=tap))
    # the echo sends the request back: no HTTP status line, so the tap reads its frame too
    assert seen == [("up", "3"), ("down", "3")]

    async def dead() -> None:
        proxy = FaultProxy(upstream=("127.0.0.1", 1), plan=FaultPlan(), seed=0)
        await proxy.start()
        r, _ = await asyncio.open_connection("127.0.0.1", proxy.port)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(r.read(), HANG_GUARD_S)
        assert proxy.count("refused") == 1
        await proxy.close()

    asyncio.run(dead())
