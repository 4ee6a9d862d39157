"""The conformance vectors in tests/vectors, checked in both directions."""

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from client.session import ClientSession, ComputeRequest, Send
from nn.params import Params
from nn.spec import ModelSpec
from nn.subnet import Subnet
from protocol import messages as m
from protocol.chunking import Block, params_layout
from protocol.errors import ErrorCode, ProtocolError
from protocol.messages import MESSAGE_TYPES, decode, encode
from protocol.reassembly import Reassembler

VECTORS = Path(__file__).parents[1] / "vectors"
_spec = importlib.util.spec_from_file_location("vectors_generate", VECTORS / "generate.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

FRAMES = sorted(p.stem for p in VECTORS.glob("*.msgpack"))


def _load(name):
    return (VECTORS / f"{name}.msgpack").read_bytes(), json.loads(
        (VECTORS / f"{name}.json").read_text()
    )


def test_vectors_cover_every_message_type_and_are_current():
    types = {json.loads((VECTORS / f"{n}.json").read_text()).get("type") for n in FRAMES}
    assert set(MESSAGE_TYPES) <= types
    # what ``generate.py --check`` does: every file rebuilt, byte for byte
    assert gen.check(gen.files(), VECTORS, ("*.msgpack", "*.json")) == []


def test_the_check_finds_a_changed_a_missing_and_an_extra_file(tmp_path):
    want = {"a.json": b"{}\n", "b.msgpack": b"\x80"}
    (tmp_path / "a.json").write_bytes(b"[]\n")
    (tmp_path / "c.json").write_bytes(b"{}\n")
    assert gen.check(want, tmp_path, ("*.json", "*.msgpack")) == [
        "missing: b.msgpack",
        "extra: c.json",
        "differs: a.json",
    ]


@pytest.mark.parametrize("name", FRAMES)
def test_frame_decodes_to_its_json_and_json_encodes_to_the_frame(name):
    frame, doc = _load(name)
    if "$error" in doc:
        with pytest.raises(ProtocolError) as info:
            decode(frame)
        assert info.value.code == ErrorCode[doc["$error"]]
        assert doc["$field"] in info.value.message
        return
    msg = decode(frame)
    assert gen.to_json(msg.to_wire()) == doc  # bytes -> message -> JSON
    wire = gen.from_json(doc)
    again = MESSAGE_TYPES[wire["type"]].from_wire(wire)  # JSON -> message -> bytes
    assert encode(again) == frame


@pytest.mark.parametrize("transfer", sorted(gen.TRANSFERS))
def test_transfer_vector_rebuilds_the_model(transfer):
    doc = json.loads((VECTORS / f"{transfer}.json").read_text())
    spec = ModelSpec.from_dict(doc["spec"])
    r = Reassembler.for_params(spec, transfer="model-3")
    for name in reversed(doc["frames"]):
        frame = (VECTORS / f"{name}.msgpack").read_bytes()
        assert len(frame) <= doc["max_message_bytes"]
        r.add(decode(frame))
    # a lossy codec rebuilds the decoded values (§11), fp32 the parameters themselves
    want = np.frombuffer(gen.from_json(doc.get("decoded_le_f32", doc["params_le_f32"])), "<f4")
    assert r.params().data.tobytes() == want.tobytes()


@pytest.mark.parametrize("codec,bits", [("int8", 8), ("int4", 4)])
def test_int_transfer_has_one_scale_per_piece_and_a_bias_block_is_one_row(codec, bits):
    """§11: int8/int4 store one scale per row of a 2-D piece, and a 1-D piece (a
    bias block) is one row: one scale for the piece, not one per value."""
    doc = json.loads((VECTORS / f"transfer_tiny_{codec}.json").read_text())
    assert doc["codec"] == codec
    spec = ModelSpec.from_dict(doc["spec"])
    params = np.frombuffer(gen.from_json(doc["params_le_f32"]), "<f4")
    decoded = np.frombuffer(gen.from_json(doc["decoded_le_f32"]), "<f4")
    assert not np.array_equal(params, decoded)  # lossy: the vector says what arrives
    biases = 0
    for name in doc["frames"]:
        c = decode((VECTORS / f"{name}.msgpack").read_bytes())
        rows = c.row_end - c.row_start
        cols = spec.widths[c.layer] if c.part == "W" else 1
        scales = rows if c.part == "W" else 1
        n = rows * cols
        assert len(c.payload) == 4 * scales + (n if bits == 8 else (n + 1) // 2), name
        biases += c.part == "b"
    assert biases == spec.num_layers
    # each value within half a quantisation step of its scale: L = 127 or 7
    L = 127 if bits == 8 else 7
    p = gen.from_json(doc["params_le_f32"])
    start = 0
    for o, i in spec.layer_shapes:
        W = np.frombuffer(p, "<f4", o * i, 4 * start).reshape(o, i)
        Wd = decoded[start : start + o * i].reshape(o, i)
        step = np.abs(W).max(axis=1, keepdims=True) / L
        assert np.all(np.abs(W - Wd) <= step / 2 + 1e-7)
        start += o * i + o  # biases of the tiny init are 0: decoded exactly
        assert not decoded[start - o : start].any()


# -- whole exchanges (generate.py's exchange_*): replayed through the client session --


def _exchange(name):
    doc = json.loads((VECTORS / f"{name}.json").read_text())
    frames = [(VECTORS / f"{s['frame']}.msgpack").read_bytes() for s in doc["steps"]]
    return doc, frames


def _same_upload(got, want, tol=1e-5):
    """An uploaded frame as the vector has it: every field exact, but a result's
    loss and a chunk's values only to float32 rounding (§12.8)."""
    g, w = decode(got), decode(want)
    assert type(g) is type(w)
    if isinstance(w, m.Chunk):
        assert (g.transfer, g.seq, g.total, g.layer, g.part, g.row_start, g.row_end, g.codec,
                g.blocks) == (w.transfer, w.seq, w.total, w.layer, w.part, w.row_start,
                              w.row_end, w.codec, w.blocks)  # fmt: skip
        np.testing.assert_allclose(
            np.frombuffer(g.payload, "<f4"), np.frombuffer(w.payload, "<f4"), rtol=1e-4, atol=tol
        )
    elif isinstance(w, m.Result):
        assert abs(g.loss - w.loss) <= tol * abs(w.loss)
        assert replace(g, loss=w.loss) == w
    else:
        assert got == want


def _replay(doc, frames, conns):
    """Feed a fresh client session the server's frames of the exchange, connection by
    connection; returns what it uploads, in order (computing each task at once)."""
    from client.compute import run_task

    session = ClientSession("vector-client/1", gen._caps())
    ups: list[bytes] = []

    def take(actions):
        for a in actions:
            if isinstance(a, Send):
                ups.append(a.frame)
            elif isinstance(a, ComputeRequest) and a.task.task_id in doc.get("computed", ["1"]):
                out = run_task(a.task, a.params, a.data)
                take(
                    session.compute_done(
                        a.request_id, out.update, 0.0, loss=out.loss, samples=out.samples,
                        steps=out.steps, compute_seconds=0.5, metrics=out.metrics,
                        boundary=out.boundary,
                    )
                )  # fmt: skip

    for conn in conns:
        if conn > conns[0]:
            session.connection_lost(0.0)
        take(session.start(0.0))
        for step, frame in zip(doc["steps"], frames, strict=True):
            if step["conn"] == conn and step["dir"] == "down":
                take(session.receive(decode(frame), 0.0))
    return ups


def test_resume_exchange():
    doc, frames = _exchange("exchange_resume")
    steps = doc["steps"]
    msgs = [decode(f) for f in frames]
    by = {(s["conn"], s["dir"], s["type"]): msgs[i] for i, s in enumerate(steps)}
    hello1, welcome1 = by[1, "up", "hello"], by[1, "down", "welcome"]
    hello2, welcome2 = by[2, "up", "hello"], by[2, "down", "welcome"]
    # §6: the resume worked because welcome's token is the one hello gave back;
    # session_id names the connection and says nothing about it
    assert hello1.resume is None and hello2.resume == welcome1.resume_token
    assert welcome2.resume_token == welcome1.resume_token
    assert welcome1.session_id != welcome2.session_id
    lost = [f for s, f in zip(steps, frames, strict=True) if s.get("delivered") is False]
    resent = [f for s, f in zip(steps, frames, strict=True) if s["conn"] == 2 and
              s["dir"] == "up" and s["type"] in ("result", "chunk")]  # fmt: skip
    assert lost and resent == lost  # the kept result, byte for byte
    task1, task2 = by[1, "down", "task"], by[2, "down", "task"]
    assert task2.task_id != task1.task_id  # §6: a resumed session is not sent task 1 again
    assert by[2, "down", "ack"] == m.Ack(task_id=task1.task_id, accepted=True)
    # the client session, fed the server's frames, uploads the same frames
    want = [f for s, f in zip(steps, frames, strict=True) if s["dir"] == "up"]
    got = _replay(doc, frames, [1, 2])
    assert len(got) == len(want) - 1  # the bye is the driver's, not the session's
    for g, w in zip(got, want[:-1], strict=True):
        _same_upload(g, w)


def test_boundary_exchange_uploads_the_update_then_the_boundary():
    doc, frames = _exchange("exchange_boundary")
    task = next(decode(f) for s, f in zip(doc["steps"], frames, strict=True) if s["type"] == "task")
    up = [decode(f) for s, f in zip(doc["steps"], frames, strict=True) if s["dir"] == "up"]
    result = next(x for x in up if isinstance(x, m.Result))
    chunks = [x for x in up if isinstance(x, m.Chunk)]
    assert result.num_chunks == len(chunks) and task.boundary == 1
    rows, width = doc["boundary_shape"]
    layout = (*params_layout(task.spec), Block(task.spec.num_layers, "h", (rows, width)))
    assert [[b.layer, b.part] for b in layout] == doc["result_layout"]
    r = Reassembler(layout, transfer=task.task_id, total=result.num_chunks)
    for c in reversed(chunks):
        r.add(c)
    arrays = r.arrays()
    want = json.loads((VECTORS / doc["compute_vector"]).read_text())["expected"]
    update = np.concatenate([arrays[b.key].ravel() for b in layout[:-1]])
    np.testing.assert_allclose(update, want["update"], rtol=1e-4, atol=1e-5)
    h = arrays[(task.spec.num_layers, "h")]
    np.testing.assert_allclose(h.ravel(), want["boundary"], rtol=1e-4, atol=1e-5)
    assert abs(result.loss - want["loss"]) <= 1e-5 * abs(want["loss"])
    ups = [f for s, f in zip(doc["steps"], frames, strict=True) if s["dir"] == "up"]
    got = _replay({**doc, "computed": [task.task_id]}, frames, [1])
    assert len(got) == len(ups)
    for g, w in zip(got, ups, strict=True):
        _same_upload(g, w)


def test_subnet_merge():
    """§3.3.1 as the text states it, in numpy: the slice is rows × columns of each
    W (those columns times the layer's scale, float32), the kept biases; the update
    goes back divided by the scale (float32 division), zero elsewhere."""
    doc = json.loads((VECTORS / "subnet_merge.json").read_text())
    spec, sub = ModelSpec.from_dict(doc["spec"]), ModelSpec.from_dict(doc["subnet_spec"])
    f32 = lambda key: np.frombuffer(gen.from_json(doc[key]), "<f4")  # noqa: E731
    full = Params.from_flat(spec, f32("model_le_f32").copy())
    hidden = sub.widths[1:-1]
    keep = np.split(np.array(doc["subnet"]), np.cumsum(hidden)[:-1])
    rows = [*keep, np.arange(spec.widths[-1])]
    cols = [np.arange(spec.widths[0]), *keep]
    scales = [1.0] + [(spec.widths[li] / len(keep[li - 1])) ** doc["rescale"]
                      for li in range(1, spec.num_layers)]  # fmt: skip
    assert [float(np.float32(s)) for s in scales] == doc["scales"]
    part = Params(sub)
    for li in range(spec.num_layers):
        part.W[li][...] = full.W[li][np.ix_(rows[li], cols[li])] * np.float32(scales[li])
        part.b[li][...] = full.b[li][rows[li]]
    assert part.data.tobytes() == f32("slice_le_f32").tobytes()
    upd = Params.from_flat(sub, f32("update_le_f32").copy())
    merged = Params(spec)
    for li in range(spec.num_layers):
        merged.W[li][np.ix_(rows[li], cols[li])] = upd.W[li] / np.float32(scales[li])
        merged.b[li][rows[li]] = upd.b[li]
    assert merged.data.tobytes() == f32("merged_le_f32").tobytes()
    # and the reference's own code gives the same bytes
    sn = Subnet.from_wire(spec, sub, np.array(doc["subnet"]), rescale=doc["rescale"])
    assert sn.slice(full).data.tobytes() == part.data.tobytes()
    assert sn.expand(upd.data).tobytes() == merged.data.tobytes()
