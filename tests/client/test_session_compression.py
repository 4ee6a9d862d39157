"""The session's compression duties: error feedback on uploads, model deltas on download."""

from __future__ import annotations

import numpy as np

from client.session import ComputeRequest
from compression import get as get_codec
from nn.params import Params
from protocol import messages as m
from protocol.chunking import chunk_params
from protocol.reassembly import Reassembler
from tests.client.test_session import SPEC, feed, ready_session, sends, task_with_model

TOPK = "topk:0.1"


def train_task(task_id: str, version: int, *, codec: str, feedback: bool) -> m.Task:
    return m.Task(
        task_id=task_id,
        model_version=version,
        spec=SPEC,
        dataset="digits#0",
        base_version=version,
        upload_codec=codec,
        error_feedback=feedback,
    )


def uploaded(actions: list) -> np.ndarray:
    """Decode the result chunks a session sent, as the server would."""
    msgs = sends(actions)
    res = next(x for x in msgs if isinstance(x, m.Result))
    reasm = Reassembler.for_params(SPEC, transfer=res.task_id, total=res.num_chunks)
    for c in msgs:
        if isinstance(c, m.Chunk):
            reasm.add(c)
    return reasm.params().data.copy()


def run_updates(feedback: bool, updates: list[np.ndarray]) -> tuple[list[np.ndarray], object]:
    s = ready_session()
    out = feed(s, task_with_model("t0", 0, SPEC.init_params(0)), 1.0)
    req = next(a for a in out if isinstance(a, ComputeRequest))
    s.compute_done(req.request_id, np.zeros(SPEC.num_params, np.float32), 1.5)
    s.receive(m.Ack(task_id="t0", accepted=True), 1.6)
    sent = []
    for i, u in enumerate(updates, start=1):
        out = s.receive(train_task(f"t{i}", 0, codec=TOPK, feedback=feedback), 2.0 * i)
        req = next(a for a in out if isinstance(a, ComputeRequest))
        sent.append(uploaded(s.compute_done(req.request_id, u, 2.0 * i + 0.5)))
        s.receive(m.Ack(task_id=f"t{i}", accepted=True), 2.0 * i + 0.6)
    return sent, s


def test_error_feedback_carries_what_top_k_dropped_into_later_updates() -> None:
    rng = np.random.default_rng(0)
    updates = [rng.normal(0, 1, SPEC.num_params).astype(np.float32) for _ in range(5)]
    sent, s = run_updates(True, updates)
    assert s.feedback is not None and s.feedback.codec is get_codec(TOPK)
    owed = _residual_flat(s)
    # nothing is lost, only late: what was sent plus what is still owed is everything
    np.testing.assert_allclose(sum(sent) + owed, sum(updates), atol=1e-4)
    plain, p = run_updates(False, updates)
    assert p.feedback is None
    assert np.linalg.norm(sum(plain) - sum(updates)) > 1.5 * np.linalg.norm(owed)


def _residual_flat(s) -> np.ndarray:
    """The residuals laid out in Params order (keys are (layer, part, r0, r1))."""
    out = Params.zeros(SPEC)
    for layer, part, r0, r1 in s.feedback.blocks():
        arr = out.W[layer] if part == "W" else out.b[layer]
        arr[r0:r1] = s.feedback.residual((layer, part, r0, r1))
    return out.data


def test_delta_download_is_added_to_the_held_model() -> None:
    s = ready_session()
    v0 = SPEC.init_params(0)
    out = feed(s, task_with_model("t0", 0, v0), 1.0)
    req = next(a for a in out if isinstance(a, ComputeRequest))
    s.compute_done(req.request_id, np.zeros(SPEC.num_params, np.float32), 1.5)
    v3 = SPEC.init_params(1)
    diff = Params.from_flat(SPEC, v3.data - v0.data)
    chunks = chunk_params(diff, max_message_bytes=1024, transfer="delta-0-3")
    task = m.Task(
        task_id="t1",
        model_version=3,
        spec=SPEC,
        dataset="digits#0",
        model_transfer="delta-0-3",
        num_chunks=len(chunks),
        delta_base=0,
    )
    out = feed(s, [task, *chunks], 2.0)
    (req,) = [a for a in out if isinstance(a, ComputeRequest)]
    np.testing.assert_allclose(req.params.data, v3.data, atol=1e-6)
    assert s.model_version == 3
    np.testing.assert_array_equal(v0.data, SPEC.init_params(0).data)  # old copy untouched


def test_delta_from_a_version_not_held_runs_nothing() -> None:
    s = ready_session()
    feed(s, task_with_model("t0", 0, SPEC.init_params(0)), 1.0)
    chunks = chunk_params(Params.zeros(SPEC), max_message_bytes=1024, transfer="delta-1-2")
    task = m.Task(
        task_id="t1",
        model_version=2,
        spec=SPEC,
        dataset="digits#0",
        model_transfer="delta-1-2",
        num_chunks=len(chunks),
        delta_base=1,
    )
    out = feed(s, [task, *chunks], 2.0)
    assert not [a for a in out if isinstance(a, ComputeRequest)]
    assert s.model_version == 0


def test_hello_offers_every_codec_and_deltas() -> None:
    from client.session import Capabilities, ClientSession

    (hello,) = sends(ClientSession("a", Capabilities()).start(0.0))
    assert hello.deltas and {"fp32", "fp16", "int8", "int4", "topk:0.01+int8"} <= set(hello.codecs)
