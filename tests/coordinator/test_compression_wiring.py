"""Codecs through the real core: compressed uploads with error feedback, refused
encoded chunks, exact byte counts, and model deltas on download."""

from __future__ import annotations

import numpy as np
import pytest

from compression import get as get_codec
from coordinator.core import events as ev
from coordinator.core.assembly import build_core
from coordinator.core.config import JobConfig, JobConfigError, parse_job
from coordinator.core.machine import Coordinator
from nn.modelfile import save_model
from nn.optim import Optimizer, OptState
from nn.params import Params
from nn.spec import ModelSpec
from nn.train import train_steps
from protocol import messages as m
from protocol.checksum import crc32
from protocol.chunking import chunk_params
from protocol.errors import ErrorCode, close_code
from testkit.loopback import Loopback
from tests.coordinator.coord_helpers import (
    acks,
    digits,
    hello,
    make_core,
    only,
    result_messages,
    sent,
    task_of,
)

TOPK = "topk:0.01+int8"


def run_digits(update: str, *, error_feedback: bool, delta: str | None = None, **codecs):
    job = parse_job(
        {
            "model": {"widths": [64, 64, 10]},
            "data": {"shards": 8, "batch": 16},
            "strategy": {"name": "decentral-async", "tau": 10, "lr": 0.1},
            "eval": {"every_versions": 5},
            "stop": {"target_accuracy": 0.95, "max_versions": 400},
            "codecs": {
                "update": update,
                "error_feedback": error_feedback,
                "delta": delta,
                **codecs,
            },
        }
    )
    core = build_core(job, seed=1, dataset=digits())
    lb = Loopback(core)
    for i in range(8):
        lb.add_client(f"c{i}", flops=1e8 * (1 + i % 4))
    lb.run(until=1e5)
    return core, lb


def bytes_per_update(lb: Loopback) -> float:
    acc = [o for o in lb.outputs if isinstance(o, ev.ResultAccepted)]
    return sum(o.frame_bytes for o in acc) / len(acc)


def test_topk_1pct_int8_with_error_feedback_reaches_the_dense_target() -> None:
    dense, lb_dense = run_digits("fp32", error_feedback=False)
    sparse, lb_sparse = run_digits(TOPK, error_feedback=True)
    for core in (dense, sparse):
        assert core.finished is not None and core.finished.reason == "target_accuracy"
        assert core.finished.accuracy is not None and core.finished.accuracy >= 0.95
    assert bytes_per_update(lb_dense) >= 16 * bytes_per_update(lb_sparse)
    # every client's upload carried its residual: the sessions hold error feedback
    residuals = [c.session.feedback for c in lb_sparse.clients.values()]
    assert all(r is not None and len(r) > 0 for r in residuals)


@pytest.fixture
def topk_core() -> tuple[Coordinator, m.Task]:
    core = make_core(codecs={"update": TOPK, "error_feedback": True})
    out = core.connect("a", hello("a", codecs=("fp32", TOPK)), 0.0)
    task = task_of(out, "a")
    assert task.upload_codec == TOPK and task.error_feedback
    return core, task


def send_all(core: Coordinator, msgs: list[m.Message], now: float = 1.0) -> list[ev.Output]:
    out: list[ev.Output] = []
    for msg in msgs:
        out += core.receive("a", msg, now, nbytes=len(m.encode(msg)))
    return out


def closed_with(out: list[ev.Output], code: ErrorCode) -> str:
    closes = only(out, ev.Close)
    assert [c.code for c in closes] == [close_code(code)], closes
    (err,) = sent(out, "a", m.Error)
    assert err.code == code
    return err.message


def result_and_chunks(task: m.Task, codec: str) -> tuple[m.Result, list[m.Chunk]]:
    update = np.random.default_rng(0).normal(0, 1e-2, task.spec.num_params).astype(np.float32)
    chunks = chunk_params(
        Params.from_flat(task.spec, update),
        max_message_bytes=1 << 20,
        codec=codec,
        transfer=task.task_id,
    )
    res = m.Result(
        task_id=task.task_id, model_version=task.model_version, num_chunks=len(chunks), steps=2
    )
    return res, chunks


def replace_payload(chunk: m.Chunk, payload: bytes, *, fix_crc: bool = True) -> m.Chunk:
    wire = chunk.to_wire()
    del wire["type"]
    wire["payload"] = payload
    wire["crc"] = crc32(payload) if fix_crc else chunk.crc
    return m.Chunk(**wire)


def test_encoded_upload_is_accepted_and_counted_in_exact_bytes(topk_core) -> None:
    core, task = topk_core
    res, chunks = result_and_chunks(task, TOPK)
    out = send_all(core, [res, *chunks])
    assert acks(out, "a") == [(task.task_id, True, "")]
    (acc,) = only(out, ev.ResultAccepted)
    assert acc.frame_bytes == sum(len(m.encode(x)) for x in [res, *chunks])
    assert acc.payload_bytes == sum(len(c.payload) for c in chunks)
    shapes = task.spec.layer_shapes
    expected = sum(
        get_codec(TOPK).encoded_size(
            (c.row_end - c.row_start, shapes[c.layer][1])
            if c.part == "W"
            else (c.row_end - c.row_start,)
        )
        for c in chunks
    )
    assert acc.payload_bytes == expected


def test_chunk_in_another_codec_than_the_task_asked_is_refused(topk_core) -> None:
    core, task = topk_core
    res, chunks = result_and_chunks(task, "fp32")
    msg = closed_with(send_all(core, [res, chunks[0]]), ErrorCode.BAD_CHUNK)
    assert "codec id 0" in msg and TOPK in msg
    assert "a" not in core.conns


def test_corrupt_payload_fails_the_checksum(topk_core) -> None:
    core, task = topk_core
    res, chunks = result_and_chunks(task, TOPK)
    bad = bytearray(chunks[0].payload)
    bad[-1] ^= 0xFF
    msg = closed_with(
        send_all(core, [res, replace_payload(chunks[0], bytes(bad), fix_crc=False)]),
        ErrorCode.CHECKSUM,
    )
    assert "crc32" in msg


@pytest.mark.parametrize("damage", ["truncated", "index_out_of_range", "k_too_large"])
def test_inconsistent_encoded_payload_is_refused(topk_core, damage: str) -> None:
    core, task = topk_core
    res, chunks = result_and_chunks(task, TOPK)
    payload = bytearray(chunks[0].payload)
    k = int.from_bytes(payload[:4], "little")
    if damage == "truncated":
        payload = payload[:-1]
    elif damage == "index_out_of_range":
        payload[4 + 4 * (k - 1) : 4 + 4 * k] = (2**31).to_bytes(4, "little")
    else:
        payload[:4] = (10**6).to_bytes(4, "little")
    msg = closed_with(
        send_all(core, [res, replace_payload(chunks[0], bytes(payload))]), ErrorCode.BAD_CHUNK
    )
    assert f"chunk 0 of {task.task_id!r}" in msg


def test_hello_codecs_are_matched_by_wire_id() -> None:
    core = make_core(codecs={"update": TOPK})
    # another fraction of the same wire id decodes the same layout
    out = core.connect("a", hello("a", codecs=("fp32", "topk:0.5+int8")), 0.0)
    assert sent(out, "a", m.Welcome)
    out = core.connect("b", hello("b", codecs=("fp32", "topk:0.01", "no-such-codec")), 0.0)
    (err,) = sent(out, "b", m.Error)
    assert err.code == ErrorCode.BAD_FIELD and TOPK in err.message


def test_unknown_codec_in_the_job_is_a_config_error() -> None:
    with pytest.raises(JobConfigError, match=r"codecs: delta: unknown codec 'fp8'"):
        parse_job({"codecs": {"delta": "fp8"}})


# -- download deltas -----------------------------------------------------------------


def finish(core: Coordinator, cid: str, out: list[ev.Output], now: float) -> list[ev.Output]:
    task = task_of(out, cid)
    res = []
    for msg in result_messages(task):
        res += core.receive(cid, msg, now)
    return res


def test_delta_when_the_held_version_is_kept_full_model_when_too_old() -> None:
    core = make_core(codecs={"delta": "fp32", "delta_versions": 2})
    a = core.connect("a", hello("a", deltas=True), 0.0)
    b = core.connect("b", hello("b", deltas=True), 0.0)
    assert only(a, ev.TaskLeased)[0].download == "full"
    a2 = finish(core, "a", a, 1.0)  # v1; a held v0, still kept -> delta 0 -> 1
    task = task_of(a2, "a")
    assert (task.model_version, task.delta_base, task.base_version) == (1, 0, None)
    (leased,) = only(a2, ev.TaskLeased)
    assert leased.download == "delta" and leased.download_bytes > 0
    delta = [c for c in sent(a2, "a", m.Chunk) if c.transfer == task.model_transfer]
    assert len(delta) == task.num_chunks
    b2 = finish(core, "b", b, 2.0)  # v2; b held v0, evicted (kept: 1, 2) -> full
    task = task_of(b2, "b")
    assert (task.model_version, task.delta_base) == (2, None)
    assert only(b2, ev.TaskLeased)[0].download == "full"


def test_client_that_does_not_apply_deltas_gets_full_models() -> None:
    core = make_core(codecs={"delta": "fp16"})
    out = core.connect("a", hello("a"), 0.0)  # hello.deltas defaults to False
    out = finish(core, "a", out, 1.0)
    assert task_of(out, "a").delta_base is None
    out = core.connect("b", hello("b", deltas=True, codecs=("fp32",)), 1.0)  # no fp16
    out = finish(core, "b", out, 2.0)
    assert task_of(out, "b").delta_base is None


def test_loopback_clients_track_the_model_through_deltas() -> None:
    core, lb = run_digits("fp32", error_feedback=False, delta="fp32", max_delta_chain=3)
    assert core.finished is not None and core.finished.reason == "target_accuracy"
    leased = [o for o in lb.outputs if isinstance(o, ev.TaskLeased)]
    kinds = [o.download for o in leased]
    assert kinds.count("delta") > kinds.count("full") > 0
    per_client: dict[str, list[str]] = {}
    for o in leased:
        per_client.setdefault(o.client_id, []).append(o.download)
    for seq in per_client.values():  # never more than max_delta_chain deltas in a row
        assert "delta" * 4 not in "".join("delta" if k == "delta" else "|" for k in seq)
    full = sum(o.download_bytes for o in leased if o.download == "full") / kinds.count("full")
    sent = [o for o in leased if o.download in ("full", "delta")]
    dl = sum(o.download_bytes for o in sent) / len(sent)
    assert dl == pytest.approx(full, rel=0.02)  # fp32 deltas cost what the model costs
    # version 0 was built by the clients from the init seed: nothing sent
    assert all(o.download_bytes == 0 for o in leased if o.download == "seed")
    assert any(o.download == "seed" for o in leased)
    assert core.downloads.deltas is not None
    checked = 0
    for c in lb.clients.values():
        snap = core.downloads.deltas.history.get(c.session.model_version)
        if snap is not None:
            np.testing.assert_allclose(c.session.model.data, snap, atol=1e-5)
            checked += 1
    assert checked > 0


def test_fp16_deltas_halve_download_bytes_and_still_reach_the_target() -> None:
    core, lb = run_digits("fp32", error_feedback=False, delta="fp16")
    assert core.finished is not None and core.finished.reason == "target_accuracy"
    leased = [o for o in lb.outputs if isinstance(o, ev.TaskLeased)]
    full = [o.download_bytes for o in leased if o.download == "full"]
    delta = [o.download_bytes for o in leased if o.download == "delta"]
    assert delta and np.mean(delta) < 0.55 * np.mean(full)


# -- distillation as a task kind -------------------------------------------------------


def distill_job(teacher: str | None) -> JobConfig:
    return parse_job(
        {
            "model": {"widths": [64, 16, 10]},
            "data": {"shards": 8, "batch": 16},
            "strategy": {"name": "decentral-async", "tau": 10, "lr": 0.1},
            "eval": {"every_versions": 5},
            "stop": {"target_accuracy": 0.93, "max_versions": 600},
            "distill": {"teacher": teacher, "temperature": 4.0, "alpha": 0.7},
        }
    )


def run_job(job: JobConfig) -> tuple[Coordinator, Loopback]:
    core = build_core(job, seed=1, dataset=digits())
    lb = Loopback(core)
    for i in range(8):
        lb.add_client(f"c{i}", flops=1e8 * (1 + i % 4))
    lb.run(until=1e5)
    return core, lb


def test_volunteers_distill_a_small_student_from_a_teacher_file(tmp_path) -> None:
    data = digits()
    teacher = ModelSpec(widths=(64, 128, 10)).init_params(0)
    opt = Optimizer(kind="momentum", lr=0.05, momentum=0.9)
    rng = np.random.default_rng(0)
    train_steps(teacher, OptState.init(opt, teacher.spec), data.X_train, data.y_train, 400, 32, rng)
    path = save_model(tmp_path / "teacher.npz", teacher)
    core, lb = run_job(distill_job(str(path)))
    assert core.finished is not None and core.finished.reason == "target_accuracy"
    tasks = sent(lb.outputs, kind=m.Task)
    assert tasks and {t.kind for t in tasks} == {"distill"}
    assert all(t.teacher_logits.shape == (t.indices.size, 10) for t in tasks)
    assert core.params.spec.widths == (64, 16, 10)
    # Whether the soft targets make this student reach 0.93 in fewer versions is
    # not asserted: at this size it is within the noise of one seed (seeds 0-5
    # took 475 versions in all with the teacher and 515 without; before shard
    # affinity changed the order of shards, 495 and 470).


def test_distill_job_config_errors(tmp_path) -> None:
    with pytest.raises(JobConfigError, match="needs a decentral"):
        parse_job({"strategy": {"name": "central-async"}, "distill": {"teacher": "t.npz"}})
    teacher = ModelSpec(widths=(32, 8, 10)).init_params(0)  # wrong input width
    path = save_model(tmp_path / "t.npz", teacher)
    with pytest.raises(ValueError, match="must keep the teacher's input and output widths"):
        build_core(distill_job(str(path)), dataset=digits())
