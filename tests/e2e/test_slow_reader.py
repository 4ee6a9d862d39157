"""A busy honest client reads a large model slower than the pacer releases it:
it is not closed 4017 (the send-queue bound is for clients that do not read),
over a real socket. The clients that do not read: test_bad_input.py."""

from __future__ import annotations

import asyncio

from websockets.asyncio.client import connect

from coordinator.http.server import bulk_room
from protocol import messages as m
from tests.e2e.e2e_helpers import digits_job, hello_frame, running

BOUND = 64 * 1024


def test_a_slow_reader_of_a_model_larger_than_the_bound_is_served() -> None:
    """A 9 MB model in 256 KiB frames, released at 125 MB/s (lan), read one frame
    every 40 ms (about 6 MB/s): the frames wait in the send queue, far past its
    64 KiB bound, but in the room for transfers; the whole model arrives and the
    connection stays open (without that room: closed 4017 after a few frames)."""
    job = digits_job(
        "decentral-async",
        model={"widths": [64, 2048, 1024, 10]},
        link={"profile": "lan", "max_message_bytes": 256 * 1024},
        stop={"target_accuracy": None, "max_versions": 10, "max_time_s": None, "patience": 0},
    )
    with running(job, send_queue_bytes=BOUND) as (bg, _, _):

        async def read_slowly() -> tuple[int, int]:
            """Chunks of the first transfer received, and how many it has."""
            async with connect(bg.url, max_size=None, compression=None, max_queue=1) as ws:
                await ws.send(hello_frame())
                got, total = 0, None
                while total is None or got < total:
                    msg = m.decode(await asyncio.wait_for(ws.recv(), 30))
                    if isinstance(msg, m.Chunk):
                        got += 1
                        total = msg.total
                        await asyncio.sleep(0.04)
                await ws.send(m.encode(m.Heartbeat(seq=1, time=0.0)))
                while not isinstance(m.decode(await asyncio.wait_for(ws.recv(), 30)), m.Heartbeat):
                    pass
                return got, total

        got, total = asyncio.run(read_slowly())
        assert total > 30 and got == total
        assert bg.crowd.net.slow_closed == 0
        assert bg.crowd.room >= BOUND + 2 * job.spec.nbytes


def test_transfer_room_is_two_of_the_largest_transfer_beside_the_bound() -> None:
    assert bulk_room(10_000_000, 1_000, 1024) == 1024 + 2 * (10_000_000 + 625_000)
    assert bulk_room(1_000, 4_000_000, 1024) == 1024 + 2 * (4_000_000 + 250_000)
    assert bulk_room(0, 0, 1024) == 1024
