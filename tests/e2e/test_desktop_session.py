"""The desktop client against a scripted server on loopback (docs/protocol.md §3.9,
§3.13, §7): only a ``finished`` bye ends it, a task whose compute raises is
declined, and a frame it cannot decode is answered with ``error`` and close 4001."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from client.desktop import DesktopClient
from nn.spec import ModelSpec
from protocol import messages as m
from protocol.chunking import chunk_params
from protocol.limits import profile

Script = Callable[[ServerConnection, int], Awaitable[None]]
SPEC = ModelSpec(widths=(64, 8, 10))
FINISHED = m.Bye(reason="finished", detail="max_versions")


async def _welcome(ws: ServerConnection) -> m.Hello:
    hello = m.decode(await ws.recv())
    assert isinstance(hello, m.Hello)
    welcome = m.Welcome(
        session_id="s",
        resume_token="tok",
        limits=profile("lan"),
        heartbeat_interval=60.0,
        decline=True,
    )
    await ws.send(m.encode(welcome))
    return hello


async def _finish(ws: ServerConnection) -> None:
    await ws.send(m.encode(FINISHED))
    await ws.close(1000, "finished")


def _run(script: Script) -> tuple[int, DesktopClient]:
    """Serve ``script(ws, connection number)`` to one DesktopClient; its exit code."""

    async def go() -> tuple[int, DesktopClient]:
        n = 0

        async def handler(ws: ServerConnection) -> None:
            nonlocal n
            n += 1
            await script(ws, n)

        async with serve(handler, "127.0.0.1", 0, compression=None) as server:
            port = server.sockets[0].getsockname()[1]
            client = DesktopClient(
                f"ws://127.0.0.1:{port}/ws",
                name="scripted",
                flops=1e9,
                backoff_base=0.01,
                backoff_cap=0.02,
                max_attempts=3,
                cache=False,
            )
            return await asyncio.wait_for(client.run(), 60), client

    return asyncio.run(go())


def test_only_a_finished_bye_ends_the_client() -> None:
    seen: list[m.Hello] = []

    async def script(ws: ServerConnection, n: int) -> None:
        seen.append(await _welcome(ws))
        if n == 1:  # a bye that does not end the job: the client comes back
            await ws.send(m.encode(m.Bye(reason="going away")))
            await ws.close(1000, "bye")
        else:
            await _finish(ws)

    code, client = _run(script)
    assert code == 0 and client.stats.connects == 2
    assert seen[1].resume == "tok"  # it resumed its session
    assert client.session is not None and client.session.bye == FINISHED


def test_a_task_whose_compute_raises_is_declined() -> None:
    got: list[m.Message] = []

    async def script(ws: ServerConnection, n: int) -> None:
        await _welcome(ws)
        chunks = chunk_params(SPEC.init_params(0), max_message_bytes=1 << 20, transfer="model-0")
        task = m.Task(
            task_id="17",
            model_version=0,
            spec=SPEC,
            dataset="digits#0",
            steps=2,
            batch=4,
            optimizer={"bogus": 1.0},  # this client's optimizer refuses it
            model_transfer="model-0",
            num_chunks=len(chunks),
        )
        for msg in (task, *chunks):
            await ws.send(m.encode(msg))
        while not any(isinstance(x, m.Decline) for x in got):
            got.append(m.decode(await ws.recv()))
        await _finish(ws)

    code, client = _run(script)
    assert code == 0 and client.stats.connects == 1
    (dec,) = [x for x in got if isinstance(x, m.Decline)]
    assert dec.task_id == "17" and dec.reason.startswith("compute: ValueError")


def test_an_undecodable_frame_is_answered_with_error_and_close_4001() -> None:
    closes: list[int | None] = []
    errors: list[m.Error] = []

    async def script(ws: ServerConnection, n: int) -> None:
        await _welcome(ws)
        if n == 1:
            await ws.send(b"\xc1")  # not msgpack
            with contextlib.suppress(ConnectionClosed):
                async for frame in ws:
                    errors.append(m.decode(frame))
            closes.append(ws.close_code)
        else:
            await _finish(ws)

    code, client = _run(script)
    assert code == 0 and client.stats.connects == 2
    assert closes == [4001]
    assert [e.code for e in errors if isinstance(e, m.Error)] == [1]  # MALFORMED
