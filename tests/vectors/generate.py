"""Conformance vectors for docs/protocol.md: ``<name>.msgpack`` frames with their
decoded form ``<name>.json``. Regenerate with ``python tests/vectors/generate.py``.

JSON form (docs/protocol.md §10): the wire map itself, with msgpack bin as
``{"$bin": "<hex>"}`` and the ndarray ext as ``{"$ndarray": {"dtype", "shape",
"data"}}``. An invalid frame's JSON is ``{"$error": "<ErrorCode name>",
"$field": "<text the message must contain>"}``. ``transfer_tiny.json`` lists the
chunk frames of one whole model and the flat float32 parameters they rebuild;
``transfer_tiny_spans.json`` the same model in chunks that span blocks;
``transfer_tiny_int8.json`` and ``transfer_tiny_int4.json`` the same model in a
lossy codec, with the values a receiver decodes. ``exchange_*.json`` are whole
conversations, each frame a vector of its own, produced by the real coordinator
core and client session (docs/protocol.md §10): a resume after a dropped
connection, and a layer-split lower task's boundary upload. ``subnet_merge.json``
pins how a sub-model task's slice is cut from the whole model and its update put
back (§3.3.1).

``--check`` rebuilds everything in memory and exits 1 (naming the files) if any
file on disk differs, or is missing or extra: regenerating is deterministic.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from nn.spec import INIT_SCHEME, ModelSpec
from protocol.checksum import crc32
from protocol.chunking import chunk_params
from protocol.limits import profile
from protocol.messages import (
    Ack,
    Bye,
    Data,
    Decline,
    Error,
    Fetch,
    Heartbeat,
    Hello,
    Message,
    Prefetch,
    Result,
    Task,
    Welcome,
    _default,
    encode,
)
from protocol.ndarray import NDARRAY_EXT, unpack_ndarray
from protocol.reassembly import Reassembler
from protocol.shardfile import encode_shard, sha256_hex

HERE = Path(__file__).parent


def to_json(obj: Any) -> Any:
    """Wire value -> JSON value (see the module docstring)."""
    if isinstance(obj, dict):
        return {k: to_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_json(v) for v in obj]
    if isinstance(obj, bytes | bytearray | memoryview):
        return {"$bin": bytes(obj).hex()}
    if isinstance(obj, np.ndarray):
        arr = {"dtype": obj.dtype.name, "shape": list(obj.shape), "data": obj.ravel().tolist()}
        return {"$ndarray": arr}
    return obj


def from_json(obj: Any) -> Any:
    """Inverse of ``to_json``."""
    if isinstance(obj, dict):
        if set(obj) == {"$bin"}:
            return bytes.fromhex(obj["$bin"])
        if set(obj) == {"$ndarray"}:
            a = obj["$ndarray"]
            return np.array(a["data"], dtype=a["dtype"]).reshape(a["shape"])
        return {k: from_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_json(v) for v in obj]
    return obj


def decode_raw(frame: bytes) -> Any:
    """A frame as plain wire values (arrays decoded, nothing validated)."""

    def hook(code: int, data: bytes) -> Any:
        if code == NDARRAY_EXT:
            return unpack_ndarray(data)
        return msgpack.ExtType(code, data)

    return msgpack.unpackb(frame, raw=False, ext_hook=hook)


def _tiny_spec() -> ModelSpec:
    return ModelSpec.preset("tiny")


def valid_messages() -> dict[str, Message]:
    spec = _tiny_spec()
    p = spec.init_params(0)
    first = chunk_params(p, max_message_bytes=1024, transfer="model-3")[0]
    return {
        "hello_minimal": Hello(client="vector-client/1"),
        "hello_full": Hello(
            client="unity/2.1",
            platform="windows-x64",
            cores=8,
            memory=17179869184,
            flops=125000000000.0,
            limits=profile("roblox"),
            codecs=("fp32", "fp16", "int8"),
            token="tok-123",
            resume="resume-abc",
            deltas=True,
            spans=True,
            init_schemes=(INIT_SCHEME,),
        ),
        "welcome_roblox": Welcome(
            session_id="s-42",
            resume_token="resume-abc",
            limits=profile("roblox"),
            heartbeat_interval=5.0,
            spans=True,
            prefetch=True,
        ),
        "welcome_unlimited": Welcome(session_id="s-43", limits=profile("unlimited")),
        "task_train": Task(
            task_id="t-1",
            kind="train",
            model_version=3,
            spec=spec,
            dataset="blobs",
            shard=2,
            steps=10,
            batch=16,
            optimizer={"kind": "momentum", "lr": 0.05, "momentum": 0.9, "nesterov": True},
            seed=12345,
            deadline=30.0,
            base_version=3,
            upload_codec="int8",
        ),
        "task_with_model": Task(
            task_id="t-2",
            kind="gradient",
            model_version=3,
            spec=spec,
            dataset="blobs",
            indices=np.array([0, 5, 9, 200], dtype=np.uint32),
            steps=1,
            batch=4,
            model_transfer="model-3",
            num_chunks=8,
        ),
        "task_delta": Task(
            task_id="t-3",
            kind="train",
            model_version=7,
            spec=spec,
            dataset="blobs",
            steps=10,
            model_transfer="delta-3-7",
            num_chunks=8,
            upload_codec="topk:0.01+int8",
            error_feedback=True,
            delta_base=3,
        ),
        "task_subnet": Task(
            task_id="t-7",
            kind="train",
            model_version=9,
            spec=ModelSpec(widths=(5, 2, 3, 2, 3)),
            dataset="blobs",
            steps=10,
            model_transfer="sub-7-9",
            num_chunks=3,
            subnet=np.array([1, 4, 0, 2, 3, 0, 4], dtype=np.uint32),
        ),
        "task_boundary": Task(
            task_id="t-8",
            kind="train",
            model_version=9,
            spec=ModelSpec(widths=(5, 4, 3)),
            dataset="blobs",
            steps=10,
            model_transfer="sub-8-9",
            num_chunks=2,
            data="ab" * 32,
            boundary=1,
        ),
        "task_seeded": Task(
            task_id="t-5",
            kind="train",
            model_version=0,
            spec=spec,
            dataset="blobs",
            steps=10,
            init_seed=42,
            init_crc=crc32(spec.init_params(42).data),
            init_scheme=INIT_SCHEME,
        ),
        "task_distill": Task(
            task_id="t-4",
            kind="distill",
            model_version=7,
            spec=spec,
            dataset="blobs",
            indices=np.array([3, 8], dtype=np.uint32),
            steps=10,
            base_version=7,
            teacher_logits=np.array([[1.5, -0.5, 0.0], [0.25, 2.0, -1.0]], dtype=np.float16),
            temperature=2.0,
            distill_alpha=0.5,
        ),
        "result_train": Result(
            task_id="t-1",
            model_version=3,
            kind="train",
            num_chunks=8,
            loss=0.125,
            samples=160,
            steps=10,
            compute_seconds=0.5,
            metrics={"accuracy": 0.75},
        ),
        "chunk_tiny_w0": first,
        "ack_accepted": Ack(task_id="t-1", accepted=True),
        "ack_stale": Ack(task_id="t-1", accepted=False, reason="stale"),
        "prefetch": Prefetch(task_id="t-1"),
        "heartbeat": Heartbeat(seq=7, time=100.25, echo=99.5),
        "heartbeat_held": Heartbeat(seq=8, time=105.25, echo=1234.5, held=4.75),
        "error": Error(code=3, message="task.steps: expected int in [1, 1000000000], got 0"),
        "bye": Bye(reason="client closing"),
        "bye_finished": Bye(reason="finished", detail="max_versions"),
        "decline": Decline(task_id="t-1", reason="memory: MemoryError"),
        "welcome_decline": Welcome(
            session_id="s-45", limits=profile("roblox"), prefetch=True, decline=True
        ),
        "task_data": Task(
            task_id="t-6",
            kind="train",
            model_version=3,
            spec=spec,
            dataset="blobs",
            shard=1,
            steps=10,
            base_version=3,
            data=sha256_hex(_shard_blob()),
        ),
        "hello_data": Hello(client="web/1", spans=True, data=True),
        "hello_kernel": Hello(client="web/1", kernel="wasm-simd-f32"),
        "welcome_data": Welcome(session_id="s-44", limits=profile("roblox"), data=True),
        "welcome_job": Welcome(session_id="s-46", limits=profile("lan"), job="digits-mlp"),
        "fetch": Fetch(data=sha256_hex(_shard_blob())),
        "data": Data(
            data=sha256_hex(_shard_blob()),
            offset=0,
            size=len(_shard_blob()),
            payload=_shard_blob(),
        ),
    }


def _shard_blob() -> bytes:
    """A 3-row shard of the tiny preset's inputs (5 features, 3 classes): §13."""
    X = np.array([[0.0, 0.5, 1.0, -1.0, 2.0], [1, 2, 3, 4, 5], [-0.25, 0, 0, 0, 0.125]])
    return encode_shard(X, np.array([2, 0, 1], dtype=np.int32), classes=3)


def invalid_frames() -> dict[str, tuple[bytes, str, str]]:
    """name -> (frame, ErrorCode name, text the error message must contain)."""
    ok = encode(Bye(reason="x"))
    subnet = valid_messages()["task_subnet"].to_wire()
    subnet["subnet"] = np.array([4, 1, 0, 2, 3, 0, 4], dtype=np.uint32)  # layer 0 unsorted
    bad_ext = msgpack.ExtType(NDARRAY_EXT, struct.pack("<BBHI", 9, 1, 0, 1) + b"\0" * 8)
    return {
        "bad_not_msgpack": (b"\xc1", "MALFORMED", "msgpack"),
        "bad_not_a_map": (msgpack.packb([1, 2, 3]), "MALFORMED", "not a map"),
        "bad_trailing_bytes": (ok + b"\x00", "MALFORMED", "msgpack"),
        "bad_unknown_type": (msgpack.packb({"type": "teleport"}), "UNKNOWN_TYPE", "teleport"),
        "bad_missing_field": (
            msgpack.packb({"type": "ack", "accepted": True}),
            "BAD_FIELD",
            "ack.task_id",
        ),
        "bad_wrong_type": (
            msgpack.packb({"type": "heartbeat", "seq": "one"}),
            "BAD_FIELD",
            "heartbeat.seq",
        ),
        "bad_out_of_range": (
            msgpack.packb({"type": "hello", "client": "c", "cores": 0}),
            "BAD_FIELD",
            "hello.cores",
        ),
        "bad_subnet_order": (
            msgpack.packb(subnet, use_bin_type=True, default=_default),
            "BAD_FIELD",
            "task.subnet",
        ),
        "bad_task_boundary": (
            msgpack.packb(
                {**valid_messages()["task_boundary"].to_wire(), "boundary": 2},
                use_bin_type=True,
                default=_default,
            ),
            "BAD_FIELD",
            "task.boundary",
        ),
        "bad_ndarray_dtype": (
            msgpack.packb({"type": "bye", "reason": "x", "extra": bad_ext}),
            "BAD_FIELD",
            "dtype",
        ),
    }


#: name -> (max_message_bytes, spans, codec): one chunk per block; chunks spanning
#: blocks, small enough that some start and end inside a block; the model in the
#: int codecs, where every piece (a 1-D bias block too) has its own scales (§5.3, §11)
TRANSFERS = {
    "transfer_tiny": (1024, False, "fp32"),
    "transfer_tiny_spans": (300, True, "fp32"),
    "transfer_tiny_int8": (1024, False, "int8"),
    "transfer_tiny_int4": (1024, False, "int4"),
}


def transfer_tiny(name: str = "transfer_tiny") -> tuple[dict[str, Any], dict[str, bytes]]:
    limit, spans, codec = TRANSFERS[name]
    spec = _tiny_spec()
    p = spec.init_params(0)
    chunks = chunk_params(p, max_message_bytes=limit, transfer="model-3", spans=spans, codec=codec)
    frames = {f"{name}_{c.seq:03d}": encode(c) for c in chunks}
    doc: dict[str, Any] = {
        "spec": spec.to_dict(),
        "max_message_bytes": limit,
        "codec": codec,
        "frames": sorted(frames),
        "params_le_f32": {"$bin": p.data.astype("<f4").tobytes().hex()},
    }
    if codec != "fp32":  # what the receiver holds: each piece decoded (§11)
        r = Reassembler.for_params(spec, transfer="model-3", total=len(chunks))
        for c in chunks:
            r.add(c)
        doc["decoded_le_f32"] = {"$bin": r.params().data.astype("<f4").tobytes().hex()}
    return doc, frames


# -- whole exchanges: the real client session (and coordinator core) talking -----------


def _compute_generator() -> Any:
    """tests/vectors/generate_compute.py (its tasks and rows), loaded by path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "vectors_generate_compute_for_wire", HERE / "generate_compute.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Recorder:
    """The frames of one exchange in the order they crossed, each named
    ``<exchange>_<nnn>``; ``delivered`` False: sent, but the connection died first."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.steps: list[dict[str, Any]] = []
        self.frames: dict[str, bytes] = {}

    def add(self, direction: str, conn: int, frame: bytes, *, delivered: bool = True) -> None:
        key = f"{self.name}_{len(self.steps):03d}"
        self.frames[key] = frame
        step = {"dir": direction, "conn": conn, "frame": key, "type": decode_raw(frame)["type"]}
        if not delivered:
            step["delivered"] = False
        self.steps.append(step)


#: what the vectors' client says it can do: the reference session's defaults, but a
#: short codec list so that the hello frames stay readable
def _caps() -> Any:
    from client.session import Capabilities

    return Capabilities(flops=1e9, codecs=("fp32", "int8"))


def exchange_boundary() -> tuple[dict[str, Any], dict[str, bytes]]:
    """A layer-split lower task (§3.3.2) through the real client session: hello,
    welcome, the task and its model's chunks, the shard fetched by hash, and the
    upload: the update's blocks then block ``(L, "h")``, the boundary of every row.
    The task is ``compute/task_train_boundary.json``'s, so the values it uploads
    are that vector's ``expected`` update and boundary."""
    from dataclasses import replace

    from client.compute import run_task
    from client.session import ClientSession, ComputeRequest, Send
    from protocol.limits import LinkLimits
    from protocol.messages import decode

    gc = _compute_generator()
    task0, _, X, y = gc.task_of("train_boundary")
    spec, init_seed, _, _ = gc.TASKS["train_boundary"]
    blob = encode_shard(X, y, classes=3)
    base = spec.init_params(init_seed)
    transfer = "sub-21-0"
    model = chunk_params(base, max_message_bytes=1024, transfer=transfer)
    task = replace(
        task0, task_id="21", dataset="vectors#0", base_version=None, model_transfer=transfer,
        num_chunks=len(model), deadline=60.0,
    )  # fmt: skip
    limits = LinkLimits(
        bytes_per_s=float("inf"), messages_per_s=float("inf"), max_message_bytes=1024
    )
    rec = _Recorder("exchange_boundary")
    session = ClientSession("vector-client/1", _caps())
    now = 0.0

    def up(actions: list[Any]) -> list[ComputeRequest]:
        todo = []
        for a in actions:
            if isinstance(a, Send):
                rec.add("up", 1, a.frame)
            elif isinstance(a, ComputeRequest):
                todo.append(a)
        return todo

    def down(msg: Message) -> list[ComputeRequest]:
        frame = encode(msg)
        rec.add("down", 1, frame)
        return up(session.receive(decode(frame), now))

    up(session.start(now))
    welcome = Welcome(session_id="c1", resume_token="r1", limits=limits, data=True, decline=True)
    todo = down(welcome) + down(task)
    for c in model:
        todo += down(c)
    assert not todo, "the shard is not here yet"
    todo = down(Data(data=task.data, offset=0, size=len(blob), payload=blob))
    (req,) = todo
    out = run_task(req.task, req.params, req.data)
    up(
        session.compute_done(
            req.request_id, out.update, now, loss=out.loss, samples=out.samples,
            steps=out.steps, compute_seconds=0.5, metrics=out.metrics, boundary=out.boundary,
        )
    )  # fmt: skip
    doc = {
        "what": "a layer-split lower task: its model, its shard, then the result whose "
        "chunks carry the update's blocks and then block (L, 'h'), the boundary",
        "compute_vector": "compute/task_train_boundary.json",
        "result_layout": [
            *([li, part] for li in range(spec.num_layers) for part in ("W", "b")),
            [spec.num_layers, "h"],
        ],
        "boundary_shape": [int(X.shape[0]), spec.widths[task.boundary or 0]],
        "steps": rec.steps,
    }
    return doc, rec.frames


def _vector_dataset() -> Any:
    """24 training rows of 5 features and 3 classes (and 6 test rows): small shards."""
    from nn.data import Dataset

    g = np.random.default_rng(11)  # only to make numbers; the frames carry them
    X = np.round(g.standard_normal((30, 5)), 3).astype(np.float32)
    y = (np.arange(30) % 3).astype(np.int32)
    return Dataset(
        name="vectors", X_train=X[:24], y_train=y[:24], X_test=X[24:], y_test=y[24:],
        num_classes=3,
    )  # fmt: skip


def exchange_resume() -> tuple[dict[str, Any], dict[str, bytes]]:
    """A session that loses its connection between computing a result and sending
    it, then resumes (§6): the real coordinator core and client session, on a
    virtual clock. Connection 1: hello, welcome, a task built from the init seed,
    its shard fetched, the result (never delivered). Connection 2: hello with the
    resume token, welcome with the same token (that is what says the resume
    worked; ``session_id`` names the connection), the next task, the kept result
    sent again, its ack, and the client's bye."""
    from client.compute import run_task
    from client.session import ClientSession, ComputeRequest, Send
    from coordinator.core import events as ev
    from coordinator.core.assembly import build_core
    from coordinator.core.config import parse_job
    from protocol.messages import decode

    job = parse_job(
        {
            "model": {"widths": [5, 4, 3]},
            "data": {"shards": 2, "batch": 4},
            "strategy": {"name": "decentral-async", "tau": 2, "lr": 0.05},
            "eval": {"every_versions": 1000, "max_samples": 6},
            "lease": {"min_s": 10.0, "slack": 1.0},
            "link": {"profile": "lan"},
        }
    )
    core = build_core(job, seed=0, dataset=_vector_dataset())
    session = ClientSession("vector-client/1", _caps())
    rec = _Recorder("exchange_resume")
    pending: list[tuple[str, bytes]] = []  # frames on their way: ("up"|"down", frame)

    def from_client(actions: list[Any], conn: int) -> list[ComputeRequest]:
        todo = []
        for a in actions:
            if isinstance(a, Send):
                pending.append(("up", a.frame))
            elif isinstance(a, ComputeRequest):
                todo.append(a)
        return todo

    def from_core(outputs: list[Any]) -> None:
        pending.extend(("down", o.frame) for o in outputs if isinstance(o, ev.Send))

    def run(conn: int, now: float, *, compute: bool) -> list[ComputeRequest]:
        """Deliver every frame in flight, in order, until none is left."""
        todo: list[ComputeRequest] = []
        while pending:
            direction, frame = pending.pop(0)
            rec.add(direction, conn, frame)
            if direction == "down":
                todo += from_client(session.receive(decode(frame), now), conn)
            else:
                from_core(core.receive(f"c{conn}", decode(frame), now, nbytes=len(frame)))
            while compute and todo:
                req = todo.pop(0)
                out = run_task(req.task, req.params, req.data)
                done = session.compute_done(
                    req.request_id, out.update, now, loss=out.loss, samples=out.samples,
                    steps=out.steps, compute_seconds=0.5, metrics=out.metrics,
                )  # fmt: skip
                for a in done:  # the connection dies before the result leaves
                    if isinstance(a, Send):
                        rec.add("up", conn, a.frame, delivered=False)
                return []
        return todo

    (hello,) = session.start(0.0)
    assert isinstance(hello, Send)
    rec.add("up", 1, hello.frame)
    from_core(core.connect("c1", decode(hello.frame), 0.0))
    run(1, 0.0, compute=True)
    pending.clear()
    session.connection_lost(1.0)
    core.disconnect("c1", 1.0, "network")
    (hello,) = session.start(2.0)
    assert isinstance(hello, Send)
    rec.add("up", 2, hello.frame)
    from_core(core.connect("c2", decode(hello.frame), 2.0))
    run(2, 2.0, compute=False)  # task 2 arrives; the vector stops before computing it
    bye = Bye(reason="client stopping")
    rec.add("up", 2, encode(bye))
    from_core(core.receive("c2", bye, 3.0))
    run(2, 3.0, compute=False)
    doc = {
        "what": "connection 1: hello, welcome, a seeded task, its shard, the result "
        "(lost with the connection); connection 2: hello with resume = the token, "
        "welcome with the same token, the next task, the result sent again, its ack, bye",
        "steps": rec.steps,
    }
    return doc, rec.frames


#: exchanges: name -> builder
EXCHANGES = {"exchange_boundary": exchange_boundary, "exchange_resume": exchange_resume}


def subnet_merge() -> dict[str, Any]:
    """§3.3.1 made exact: the slice a sub-model task carries (kept rows of every
    layer, kept columns of the next, those scaled by ``(n/k)^rescale``) and how its
    update goes back into the whole model's layout (divided by the same scale,
    zero elsewhere). The reference server does this (nn/subnet.py); a client
    never needs it, a second server does."""
    from nn.params import Params
    from nn.subnet import Subnet

    spec = ModelSpec(widths=(5, 4, 6, 3))
    sub_spec = ModelSpec(widths=(5, 3, 4, 3))
    flat = np.array([0, 2, 3, 1, 2, 4, 5], dtype=np.uint32)  # the task's subnet
    full = spec.init_params(4)
    sn = Subnet.from_wire(spec, sub_spec, flat, rescale=1.0)
    part = sn.slice(full)
    g = np.random.default_rng(3)  # only to make numbers; the JSON carries them
    update = np.round(g.standard_normal(sub_spec.num_params), 3).astype(np.float32)
    merged = sn.expand(update)
    into = Params(spec)  # the in-place merge multiplies by float32(1/scale) instead
    sn.add_to(into, update)
    assert np.allclose(into.data, merged, rtol=1e-6, atol=0)
    return {
        "spec": spec.to_dict(),
        "subnet_spec": sub_spec.to_dict(),
        "subnet": flat.tolist(),
        "rescale": 1.0,
        "scales": [float(np.float32(sn._index(li)[2])) for li in range(spec.num_layers)],
        "model_le_f32": {"$bin": full.data.astype("<f4").tobytes().hex()},
        "slice_le_f32": {"$bin": part.data.astype("<f4").tobytes().hex()},
        "update_le_f32": {"$bin": update.astype("<f4").tobytes().hex()},
        "merged_le_f32": {"$bin": merged.astype("<f4").tobytes().hex()},
    }


def build() -> dict[str, tuple[bytes, Any]]:
    """Every vector as name -> (frame bytes or b"" for a JSON-only file, JSON)."""
    out: dict[str, tuple[bytes, Any]] = {}
    for name, msg in valid_messages().items():
        frame = encode(msg)
        out[name] = (frame, to_json(decode_raw(frame)))
    for name, (frame, code, text) in invalid_frames().items():
        out[name] = (frame, {"$error": code, "$field": text})
    for transfer in TRANSFERS:
        doc, frames = transfer_tiny(transfer)
        for name, frame in frames.items():
            out[name] = (frame, to_json(decode_raw(frame)))
        out[transfer] = (b"", doc)
    for exchange, make in EXCHANGES.items():
        doc, frames = make()
        for name, frame in frames.items():
            out[name] = (frame, to_json(decode_raw(frame)))
        out[exchange] = (b"", doc)
    out["subnet_merge"] = (b"", subnet_merge())
    return out


def dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=False, allow_nan=False) + "\n"


def files() -> dict[str, bytes]:
    """Every file the vectors consist of: file name -> bytes."""
    out: dict[str, bytes] = {}
    for name, (frame, doc) in build().items():
        if frame:
            out[f"{name}.msgpack"] = frame
        out[f"{name}.json"] = dump_json(doc).encode()
    return out


def check(want: dict[str, bytes], folder: Path, patterns: tuple[str, ...]) -> list[str]:
    """What differs between ``want`` and the files in ``folder`` matching ``patterns``."""
    have = {p.name for pat in patterns for p in folder.glob(pat)}
    bad = [f"missing: {n}" for n in sorted(set(want) - have)]
    bad += [f"extra: {n}" for n in sorted(have - set(want))]
    bad += [
        f"differs: {n}" for n in sorted(set(want) & have) if (folder / n).read_bytes() != want[n]
    ]
    return bad


def main(argv: list[str]) -> int:
    want = files()
    if "--check" in argv:
        bad = check(want, HERE, ("*.msgpack", "*.json"))
        for line in bad:
            print(line, file=sys.stderr)
        return 1 if bad else 0
    for old in (*HERE.glob("*.msgpack"), *HERE.glob("*.json")):
        old.unlink()
    for name, data in want.items():
        (HERE / name).write_bytes(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
