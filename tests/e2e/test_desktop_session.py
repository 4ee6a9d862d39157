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


class Said:
    """A reporter (client.report.Reporter) that keeps what the client said."""

    progress_interval = 0.0

    def __init__(self) -> None:
        self.said: list[str] = []
        self.problems: list[str] = []

    def say(self, text: str) -> None:
        self.said.append(text)

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def progress(self, text: str) -> None:
        raise AssertionError("no progress lines at interval 0")


def _run(script: Script, reporter: Said | None = None) -> tuple[int, DesktopClient]:
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
                reporter=reporter,
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


def test_a_version_the_coordinator_does_not_speak_ends_the_client_with_a_sentence() -> None:
    said = Said()

    async def script(ws: ServerConnection, n: int) -> None:
        await ws.recv()  # hello
        await ws.close(4004, "hello.version: 1 not served")

    code, client = _run(script, said)
    assert code == 2 and client.stats.connects == 1  # not retried
    assert said.problems == [
        "the coordinator does not speak this client's protocol version; install the "
        "crowdgrad version it runs: hello.version: 1 not served"
    ]
    assert said.said == []  # it never joined: the problem was the last word


def test_a_close_by_the_coordinator_is_said_then_it_rejoins_and_sums_up() -> None:
    said = Said()

    async def script(ws: ServerConnection, n: int) -> None:
        await _welcome(ws)
        if n == 1:
            await ws.close(4014, "no message for 15 s")
        else:
            await _finish(ws)

    code, _ = _run(script, said)
    assert code == 0
    (problem,) = said.problems
    assert problem.startswith(
        "the coordinator closed the connection (close 4014 TIMEOUT: no message for 15 s); "
        "trying again in "
    )
    joined, again, left = said.said
    assert joined.startswith("joined the job at ws://127.0.0.1:")
    assert again.startswith("joined again (session resumed): the job at")
    assert left.startswith("left after ") and "the job finished (max_versions)" in left
    assert "0 tasks done" in left and "2 connections" in left
