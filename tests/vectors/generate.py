"""Conformance vectors for docs/protocol.md: ``<name>.msgpack`` frames with their
decoded form ``<name>.json``. Regenerate with ``python tests/vectors/generate.py``.

JSON form (docs/protocol.md §10): the wire map itself, with msgpack bin as
``{"$bin": "<hex>"}`` and the ndarray ext as ``{"$ndarray": {"dtype", "shape",
"data"}}``. An invalid frame's JSON is ``{"$error": "<ErrorCode name>",
"$field": "<text the message must contain>"}``. ``transfer_tiny.json`` lists the
chunk frames of one whole model and the flat float32 parameters they rebuild;
``transfer_tiny_spans.json`` the same model in chunks that span blocks.
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


#: name -> (max_message_bytes, spans): one chunk per block; chunks spanning blocks,
#: small enough that some start and end inside a block (docs/protocol.md §5.3)
TRANSFERS = {"transfer_tiny": (1024, False), "transfer_tiny_spans": (300, True)}


def transfer_tiny(name: str = "transfer_tiny") -> tuple[dict[str, Any], dict[str, bytes]]:
    limit, spans = TRANSFERS[name]
    spec = _tiny_spec()
    p = spec.init_params(0)
    chunks = chunk_params(p, max_message_bytes=limit, transfer="model-3", spans=spans)
    frames = {f"{name}_{c.seq:03d}": encode(c) for c in chunks}
    doc = {
        "spec": spec.to_dict(),
        "max_message_bytes": limit,
        "frames": sorted(frames),
        "params_le_f32": {"$bin": p.data.astype("<f4").tobytes().hex()},
    }
    return doc, frames


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
    return out


def dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=False, allow_nan=False) + "\n"


def main() -> int:
    for old in (*HERE.glob("*.msgpack"), *HERE.glob("*.json")):
        old.unlink()
    for name, (frame, doc) in build().items():
        if frame:
            (HERE / f"{name}.msgpack").write_bytes(frame)
        (HERE / f"{name}.json").write_text(dump_json(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
