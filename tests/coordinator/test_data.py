"""Shards named by hash: tasks carry them, ``fetch`` is answered with paced ``data``
frames that rebuild the exact shard, and a job on a user's file needs clients that
fetch (docs/protocol.md §13)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from coordinator.core import events as ev
from coordinator.core.assembly import build_core
from coordinator.core.config import parse_job
from coordinator.core.data import DataCatalog, load_job_data
from protocol import messages as m
from protocol.errors import ErrorCode
from protocol.shardfile import decode_shard, sha256_hex
from tests.coordinator.coord_helpers import digits, hello, make_core, make_job, only, sent


def _rebuild(frames: list[m.Data]) -> bytes:
    buf = bytearray()
    for f in frames:
        assert f.offset == len(buf)
        buf += f.payload
    assert len(buf) == frames[0].size
    return bytes(buf)


def test_catalog_cuts_the_job_shards_and_names_them_by_hash() -> None:
    job = make_job()
    cat = DataCatalog.for_job(job, digits())
    assert len(cat.shards) == job.data.shards
    for s, idx in zip(cat.shards, cat.indices, strict=True):
        assert s.sha256 == sha256_hex(s.blob)
        got = decode_shard(s.blob)
        np.testing.assert_array_equal(got.X, digits().X_train[idx])
        np.testing.assert_array_equal(got.y, digits().y_train[idx])
    # The same job and data give the same hashes: warm caches stay warm across restarts.
    again = DataCatalog.for_job(job, digits())
    assert [s.sha256 for s in again.shards] == [s.sha256 for s in cat.shards]


def test_a_fetching_client_gets_the_shard_hash_and_the_frames_rebuild_it() -> None:
    core = make_core(link={"profile": "roblox"})
    out = core.connect("a", hello("a", data=True), 0.0)
    (welcome,) = sent(out, "a", m.Welcome)
    assert welcome.data
    out += core.tick(5.0)
    (task,) = sent(out, "a", m.Task)
    shard = core.data.shards[task.shard]
    assert task.data == shard.sha256 and task.indices is None
    out = core.receive("a", m.Fetch(data=task.data), 5.0)
    (served,) = only(out, ev.DataServed)
    assert served.nbytes == len(shard.blob)
    t, frames = 5.0, sent(out, "a", m.Data)
    while sum(len(f.payload) for f in frames) < len(shard.blob):  # paced at 50 kB/s
        t = core.next_wakeup()
        assert t is not None
        frames += sent(core.tick(t), "a", m.Data)
    assert _rebuild(frames) == shard.blob
    assert all(len(m.encode(f)) <= core.conns["a"].limits.frame_bytes for f in frames)
    assert t > 5.0  # a 43 kB shard and the task's model do not fit one burst


def test_fetch_from_an_offset_sends_the_rest() -> None:
    core = make_core()
    core.connect("a", hello("a", data=True), 0.0)
    sha = core.data.shards[1].sha256
    out = core.receive("a", m.Fetch(data=sha, offset=1000), 1.0)
    frames = sent(out, "a", m.Data)
    assert frames[0].offset == 1000
    assert b"".join(bytes(f.payload) for f in frames) == core.data.shards[1].blob[1000:]


@pytest.mark.parametrize(
    "fetch, code",
    [
        (m.Fetch(data="0" * 64), ErrorCode.UNKNOWN_TASK),
        (None, ErrorCode.BAD_FIELD),  # offset past the end
    ],
)
def test_bad_fetches_close_with_a_named_code(fetch, code) -> None:
    core = make_core()
    core.connect("a", hello("a", data=True), 0.0)
    if fetch is None:
        s = core.data.shards[0]
        fetch = m.Fetch(data=s.sha256, offset=len(s.blob))
    out = core.receive("a", fetch, 1.0)
    (err,) = sent(out, "a", m.Error)
    assert err.code == int(code)
    assert only(out, ev.Close)


def test_a_client_without_data_gets_indices_into_the_named_dataset() -> None:
    core = make_core()
    out = core.connect("old", hello("old"), 0.0)
    (task,) = sent(out, "old", m.Task)
    assert task.data is None and task.dataset == "digits#0"
    np.testing.assert_array_equal(task.indices, core.data.indices[task.shard])


def _user_job(tmp_path: Path, **data: object):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "u.npz", X=rng.normal(size=(60, 5)), y=rng.integers(0, 3, 60))
    return parse_job(
        {"model": {"widths": [5, 8, 3]}, "data": {"path": str(tmp_path / "u.npz"), **data}}
    )


def test_a_file_job_refuses_clients_that_do_not_fetch(tmp_path: Path) -> None:
    job = _user_job(tmp_path, shards=2)
    core = build_core(job, dataset=load_job_data(job))
    out = core.connect("old", hello("old"), 0.0)
    (err,) = sent(out, "old", m.Error)
    assert err.code == int(ErrorCode.BAD_FIELD) and "hello.data" in err.message
    out = core.connect("new", hello("new", data=True), 0.0)
    (task,) = sent(out, "new", m.Task)
    assert task.data in core.data.by_hash and task.dataset == "u#0"


def test_a_model_that_does_not_fit_the_data_is_refused_at_load(tmp_path: Path) -> None:
    job = _user_job(tmp_path).replace(model={"widths": [20, 8, 3]})
    with pytest.raises(ValueError, match="5 features, the model's input width is 20"):
        load_job_data(job)
    with pytest.raises(ValueError, match="64 features, the model's input width is 20"):
        load_job_data(make_job(model={"widths": [20, 32, 3]}))


def test_job_file_paths_are_relative_to_the_job(tmp_path: Path) -> None:
    from coordinator.core.config import JobConfigError, load_job

    (tmp_path / "sub").mkdir()
    np.savez(tmp_path / "sub" / "d.npz", X=np.ones((4, 2)), y=np.array([0, 1, 0, 1]))
    (tmp_path / "sub" / "job.toml").write_text('[data]\npath = "d.npz"\n')
    job = load_job(tmp_path / "sub" / "job.toml")
    assert job.data.path == str(tmp_path / "sub" / "d.npz")
    (tmp_path / "both.toml").write_text('[data]\npath = "d.npz"\ndataset = "digits"\n')
    with pytest.raises(JobConfigError, match="either 'dataset'"):
        load_job(tmp_path / "both.toml")
    (tmp_path / "label.toml").write_text('[data]\npath = "d.npz"\nlabel = "y"\n')
    with pytest.raises(JobConfigError, match=r"label column of a \.csv"):
        load_job(tmp_path / "label.toml")
