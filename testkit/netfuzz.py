"""Hostile frames through a real server: websockets over loopback, many connections.

The frames of ``testkit.hostile`` go to a running coordinator's ``/ws`` the way
a stranger would send them: each connection says a valid ``hello`` (its own
source address from 127.0.0.0/8, so admission's per-address bounds see a crowd,
not one host), takes its welcome, then sends hostile frames until the server
closes it, and the next connection takes over. ``workers`` connections run at
once. The report counts frames, connections, the close codes the server sent
(each must be one docs/protocol.md §7 documents) and connections the server
refused before hello. What the server does with them (crash, memory, an honest
client beside them) the caller watches: benchmarks/fuzz.py ``--server``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from protocol import messages as m
from protocol.errors import ProtocolError
from testkit import hostile
from testkit.fuzzing import DOCUMENTED_CLOSES

#: source addresses the connections rotate through (127.0.0.0/8 all reach lo)
ADDRESSES = 4096
#: 1006 (no close frame: the peer was reset) is the websocket library's, not a
#: code the server sends; the server's refusals before hello are HTTP statuses
NOT_SENT = 1006


def source_address(i: int) -> str:
    j = i % ADDRESSES
    return f"127.{3 + j // 62_500}.{j // 250 % 250}.{j % 250 + 2}"


@dataclass(slots=True)
class NetFuzzReport:
    frames: int = 0
    connections: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    closes: Counter[int] = field(default_factory=Counter)
    #: connections refused at the handshake (HTTP status) or never opened
    refused: Counter[str] = field(default_factory=Counter)
    #: hellos answered with something other than welcome
    not_welcomed: int = 0

    @property
    def undocumented_closes(self) -> dict[int, int]:
        return {
            c: n for c, n in self.closes.items() if c not in DOCUMENTED_CLOSES and c != NOT_SENT
        }

    def summary(self) -> dict[str, Any]:
        return {
            "frames": self.frames,
            "connections": self.connections,
            "kinds": dict(self.kinds),
            "closes": {str(k): v for k, v in sorted(self.closes.items())},
            "undocumented_closes": self.undocumented_closes,
            "refused": dict(self.refused),
            "not_welcomed": self.not_welcomed,
        }


async def fuzz_server(
    url: str, frames: int, *, seed: int = 0, workers: int = 16, hello_timeout: float = 30.0
) -> NetFuzzReport:
    """Send ``frames`` hostile frames to the coordinator at ``url`` (ws://HOST:PORT/ws)."""
    report = NetFuzzReport()
    rng = random.Random(seed)
    task_ids: list[str] = []

    async def one_connection(i: int) -> None:
        report.connections += 1
        ws = None
        hello = m.encode(m.Hello(client=f"fuzz-{i}", data=rng.random() < 0.5))
        try:
            async with connect(
                url,
                compression=None,
                max_size=None,
                open_timeout=hello_timeout,
                ping_interval=None,
                close_timeout=2,
                local_addr=(source_address(i), 0),
            ) as ws:
                await ws.send(hello)
                try:
                    first = m.decode(await asyncio.wait_for(ws.recv(), hello_timeout))
                except (ProtocolError, TimeoutError):
                    first = None
                if not isinstance(first, m.Welcome):
                    report.not_welcomed += 1
                    return
                reader = asyncio.ensure_future(_read(ws, task_ids))
                try:
                    while report.frames < frames and not reader.done():
                        kind, raw = hostile.frame(rng, task_ids[-50:])
                        report.frames += 1
                        report.kinds[kind] += 1
                        await ws.send(raw)
                        await asyncio.sleep(0)  # the reader sees a close before the next
                finally:
                    reader.cancel()
                    with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                        await reader
        except ConnectionClosed:
            pass
        except InvalidStatus as exc:
            report.refused[f"http {exc.response.status_code}"] += 1
        except (OSError, TimeoutError) as exc:
            report.refused[type(exc).__name__] += 1
        finally:
            code = _close_code(ws)
            if code is not None:
                report.closes[code] += 1

    async def worker(w: int) -> None:
        i = w
        while report.frames < frames:
            await one_connection(i)
            i += workers

    await asyncio.gather(*(worker(w) for w in range(workers)))
    return report


async def _read(ws: Any, task_ids: list[str]) -> None:
    """Read until the server closes; keep the task ids it hands this connection."""
    async for frame in ws:
        with contextlib.suppress(ProtocolError):
            msg = m.decode(frame)
            if isinstance(msg, m.Task):
                task_ids.append(msg.task_id)
                del task_ids[:-200]


def _close_code(ws: Any) -> int | None:
    """The code of the close frame the server sent, if it sent one."""
    rcvd = getattr(getattr(ws, "protocol", None), "close_rcvd", None)
    if rcvd is not None:
        return int(rcvd.code)
    return NOT_SENT if ws is not None and getattr(ws, "close_code", None) is not None else None
