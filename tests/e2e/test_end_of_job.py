"""The end of a job over a real socket (docs/protocol.md §3.9): every result the
coordinator accepted is acknowledged before its ``bye`` (reason ``finished``) and
close 1000, also while acks wait for a durable checkpoint (``ack_durable``)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from coordinator.core import events as ev
from coordinator.http.server import CrowdServer
from coordinator.http.serving import BackgroundServer
from coordinator.runtime.service import CoreService
from protocol import messages as m
from tests.coordinator.coord_helpers import result_messages
from tests.e2e.e2e_helpers import ROOT, Recorder, digits_job, hello_frame

RESULTS = 40


async def _peer(url: str, name: str) -> tuple[list[str], list[m.Ack], list[m.Message], int | None]:
    """A client that answers every task at once; returns the task ids it answered, the
    acks, everything after the last ack, and the close code."""
    answered: list[str] = []
    got_acks: list[m.Ack] = []
    after: list[m.Message] = []
    outbox: asyncio.Queue[bytes] = asyncio.Queue()

    async def send(ws) -> None:  # results go out beside the reads, never instead of them
        while True:
            frame = await outbox.get()
            await ws.send(frame)

    async with connect(url, max_size=None, compression=None) as ws:
        await ws.send(hello_frame(name))
        sender = asyncio.create_task(send(ws))
        try:
            async for frame in ws:
                msg = m.decode(frame)
                if isinstance(msg, m.Task):
                    answered.append(msg.task_id)
                    for out in result_messages(msg):
                        outbox.put_nowait(m.encode(out))
                elif isinstance(msg, m.Ack):
                    got_acks.append(msg)
                    after.clear()
                else:
                    after.append(msg)
        except ConnectionClosed:
            pass
        finally:
            sender.cancel()
        return answered, got_acks, after, ws.close_code


def test_every_accepted_result_is_acked_before_the_bye(tmp_path: Path) -> None:
    # Run in a fresh interpreter: after ~300 other tests in the same process two of
    # the three peers were seen to get neither acks nor bye. Found since: the peers
    # awaited their own result frames without reading, so under flow control a peer
    # and the server could each wait for the other, until the close timeout (1 run
    # in 4 failed so, isolated too); _peer now sends beside its reads (12 of 12).
    if os.environ.get("CROWDGRAD_END_OF_JOB_CHILD") != "1":
        res = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             f"{__file__}::test_every_accepted_result_is_acked_before_the_bye"],
            cwd=ROOT, env={**os.environ, "CROWDGRAD_END_OF_JOB_CHILD": "1"},
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert res.returncode == 0, res.stdout[-4000:]
        return
    job = digits_job(
        "decentral-async",
        stop={"target_accuracy": None, "max_versions": RESULTS, "max_time_s": None},
        eval={"every_versions": 1000},
    )
    # Acks wait up to 30 s for a durable commit: the job ends with most still held.
    service = CoreService(job, store=tmp_path / "store", durable_interval=30.0)
    rec = Recorder()
    service.add_sink(rec)
    with BackgroundServer(CrowdServer(service)) as bg:

        async def go() -> list[tuple[list[str], list[m.Ack], list[m.Message], int | None]]:
            peers = [_peer(bg.url, f"p{i}") for i in range(3)]
            return await asyncio.wait_for(asyncio.gather(*peers), 120)

        peers = asyncio.run(go())
        assert service.done.wait(30)
    accepted = rec.of(ev.ResultAccepted)
    assert len(accepted) == RESULTS == service.stats.accepted
    acked = [a.task_id for _, got, _, _ in peers for a in got if a.accepted]
    assert sorted(acked) == sorted(str(a.task_id) for a in accepted)  # 40 of 40
    for answered, got, after, code in peers:
        # every result it sent got an answer (accepted, or stale after the end)...
        assert {a.task_id for a in got} >= set(answered[:-1])
        # ...before the bye that ends the job, then close 1000
        byes = [x for x in after if isinstance(x, m.Bye)]
        assert byes == [m.Bye(reason="finished", detail="max_versions")]
        assert code == 1000
