"""The session fetches the shard a task names once, from the cache or the server,
checks it against its hash, resumes a cut fetch, and computes on exactly those rows."""

from __future__ import annotations

import dataclasses

import numpy as np

from client.compute import run_task
from client.datacache import DiskCache, MemoryCache
from client.session import Capabilities, ClientSession, ComputeRequest, Send
from nn.spec import ModelSpec
from protocol import messages as m
from protocol.chunking import chunk_params
from protocol.limits import PROFILES
from protocol.shardfile import decode_shard, encode_shard, sha256_hex

SPEC = ModelSpec(widths=(8, 6, 3))
RNG = np.random.default_rng(3)
BLOB = encode_shard(RNG.normal(size=(40, 8)), RNG.integers(0, 3, 40), classes=3)
SHA = sha256_hex(BLOB)


def _task(task_id: str = "1", sha: str = SHA) -> list[m.Message]:
    params = SPEC.init_params(0)
    chunks = chunk_params(params, max_message_bytes=1024, transfer="model-0")
    t = m.Task(
        task_id=task_id, model_version=0, spec=SPEC, dataset="u#0", steps=3, batch=4,
        model_transfer="model-0", num_chunks=len(chunks), data=sha,
    )  # fmt: skip
    return [t, *chunks]


def _frames(blob: bytes = BLOB, sha: str = SHA, step: int = 200, start: int = 0) -> list[m.Data]:
    return [
        m.Data(data=sha, offset=o, size=len(blob), payload=blob[o : o + step])
        for o in range(start, len(blob), step)
    ]


def _session(cache=None) -> ClientSession:
    s = ClientSession("c", Capabilities(flops=1e9), cache=cache)
    (hello,) = s.start(0.0)
    assert hello.message.data  # hello.data: this client fetches shards
    welcome = m.Welcome(session_id="s", limits=PROFILES["lan"], data=True)
    s.receive(welcome, 0.1)
    return s


def _feed(s: ClientSession, msgs, now: float = 1.0) -> list:
    out: list = []
    for msg in msgs:
        out += s.receive(msg, now)
    return out


def _sent(out, kind):
    return [a.message for a in out if isinstance(a, Send) and isinstance(a.message, kind)]


def _requests(out) -> list[ComputeRequest]:
    return [a for a in out if isinstance(a, ComputeRequest)]


def test_a_cold_session_fetches_then_computes_on_the_shard_rows() -> None:
    cache = MemoryCache()
    s = _session(cache)
    out = _feed(s, _task())
    assert _sent(out, m.Fetch) == [m.Fetch(data=SHA)]
    assert not _requests(out)  # the model is here, the rows are not
    out = _feed(s, _frames())
    (req,) = _requests(out)
    assert req.data is not None and req.data.rows == 40
    assert cache.get(SHA) == BLOB and s.data_bytes == len(BLOB)
    ours = run_task(req.task, req.params, req.data)
    # An independent computation on the decoded shard gives the same update.
    from protocol.shardfile import decode_shard

    again = run_task(req.task, req.params, decode_shard(BLOB))
    np.testing.assert_array_equal(ours.update, again.update)


def test_a_warm_cache_sends_no_fetch() -> None:
    cache = MemoryCache()
    cache.put(SHA, BLOB)
    s = _session(cache)
    out = _feed(s, _task())
    assert not _sent(out, m.Fetch)
    assert len(_requests(out)) == 1 and s.data_bytes == 0


def test_a_cut_fetch_goes_on_from_the_bytes_received(tmp_path) -> None:
    s = _session(DiskCache(tmp_path))
    _feed(s, _task())
    first = _frames()[:3]
    _feed(s, first)
    s.connection_lost(2.0)
    s.start(3.0)
    s.receive(m.Welcome(session_id="s", limits=PROFILES["lan"], data=True), 3.1)
    out = _feed(s, _task("2"), 3.2)
    assert _sent(out, m.Fetch) == [m.Fetch(data=SHA, offset=600)]
    out = _feed(s, _frames(start=600), 3.3)
    assert len(_requests(out)) == 1
    assert (tmp_path / f"{SHA}.shard").read_bytes() == BLOB


def test_a_shard_that_does_not_match_its_hash_is_never_used_or_cached() -> None:
    cache = MemoryCache()
    s = _session(cache)
    _feed(s, _task())
    bad = bytearray(BLOB)
    bad[100] ^= 1
    out = _feed(s, _frames(bytes(bad)))
    assert not _requests(out) and cache.get(SHA) is None and SHA not in s.shards


def test_disk_cache_drops_a_file_that_no_longer_matches(tmp_path) -> None:
    c = DiskCache(tmp_path)
    c.put(SHA, BLOB)
    assert c.get(SHA) == BLOB
    (tmp_path / f"{SHA}.shard").write_bytes(BLOB[:-1])
    assert c.get(SHA) is None and not (tmp_path / f"{SHA}.shard").exists()


def test_a_client_that_does_not_fetch_says_so() -> None:
    s = ClientSession("c", dataclasses.replace(Capabilities(), data=False))
    (hello,) = s.start(0.0)
    assert not hello.message.data and "data" not in hello.message.to_wire()


def test_caches_keep_at_most_their_bytes_least_recently_used_going_first(tmp_path) -> None:
    """A layer-split job sends a new shard per upper task: no cache grows without end."""
    blobs = [bytes([i]) * 1000 for i in range(5)]
    shas = [sha256_hex(b) for b in blobs]
    mem = MemoryCache(max_bytes=2500)
    for sha, blob in zip(shas[:2], blobs[:2], strict=True):
        mem.put(sha, blob)
    assert mem.get(shas[0]) == blobs[0]  # used: now the newest
    mem.put(shas[2], blobs[2])
    assert mem.get(shas[1]) is None and mem.get(shas[0]) == blobs[0]
    (tmp_path / "old").mkdir()
    disk = DiskCache(tmp_path / "old", max_bytes=2500)
    disk.put(shas[0], blobs[0])
    again = DiskCache(tmp_path / "old", max_bytes=2500)  # a later run: reads the folder
    for sha, blob in zip(shas[1:4], blobs[1:4], strict=True):
        again.put(sha, blob)
    kept = sorted(p.stem for p in (tmp_path / "old").glob("*.shard"))
    assert kept == sorted(shas[2:4])


def test_a_session_keeps_a_bounded_number_of_decoded_shards() -> None:
    from client.session import MAX_HELD_SHARDS

    s = _session(MemoryCache())
    for i in range(MAX_HELD_SHARDS + 5):
        blob = encode_shard(np.full((2, 64), i, np.float32), np.zeros(2, np.int32), classes=10)
        s._hold(sha256_hex(blob), decode_shard(blob))
    assert len(s.shards) == MAX_HELD_SHARDS
