"""A client that reconnects before the server has seen its old connection end
(a network change: the old TCP connection is half-open) resumes its session over
real websockets; the old connection is closed 4018 (docs/protocol.md §6)."""

from __future__ import annotations

import asyncio

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from coordinator.core import events as ev
from protocol import messages as m
from protocol.errors import ErrorCode
from tests.e2e.e2e_helpers import digits_job, hello_frame, running


async def _until(ws: ClientConnection, kind: type[m.Message]) -> m.Message:
    while True:
        msg = m.decode(await asyncio.wait_for(ws.recv(), 10))
        if isinstance(msg, kind):
            return msg


async def _take_over(url: str) -> tuple[str, str, int | None, list[int], m.Task]:
    async with connect(url, max_size=None, compression=None) as old:
        await old.send(hello_frame("phone"))
        welcome = await _until(old, m.Welcome)
        task = await _until(old, m.Task)
        # the phone moved from wifi to mobile data: a new connection, the old one open
        async with connect(url, max_size=None, compression=None) as new:
            await new.send(hello_frame("phone", resume=welcome.resume_token))
            again = await _until(new, m.Welcome)
            errors: list[int] = []
            try:
                while True:
                    msg = m.decode(await asyncio.wait_for(old.recv(), 10))
                    if isinstance(msg, m.Error):
                        errors.append(msg.code)
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd else None
            return welcome.resume_token, again.resume_token, code, errors, task


def test_a_second_connection_with_the_token_takes_the_session_over() -> None:
    job = digits_job("decentral-async", stop={"target_accuracy": None, "max_versions": 10_000})
    with running(job) as (bg, _service, rec):
        token, again, code, errors, task = asyncio.run(_take_over(bg.url))
        assert again == token  # the same session, resumed
        assert (code, errors) == (4018, [ErrorCode.REPLACED])
        joined = rec.of(ev.ClientJoined)
        assert [j.resumed for j in joined] == [False, True]
        assert rec.of(ev.ClientLeft)[0].reason == "closed: REPLACED"
        # the task the old connection held was not reissued while its holder was back
        leased = [t.task_id for t in rec.of(ev.TaskLeased)]
        assert leased.count(int(task.task_id)) == 1
