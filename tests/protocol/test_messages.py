import math
import tracemalloc

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nn.spec import ModelSpec
from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import profile
from protocol.messages import (
    KERNELS,
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    Ack,
    Bye,
    Chunk,
    Data,
    Decline,
    Error,
    Fetch,
    Heartbeat,
    Hello,
    Prefetch,
    Result,
    Task,
    Welcome,
    choose_version,
    decode,
    encode,
)
from protocol.ndarray import pack_ndarray


def examples():
    """At least one instance of every message type, optional fields set and unset."""
    spec = ModelSpec.preset("small")
    return [
        Hello(client="crowdgrad-py/0.1"),
        Hello(
            client="unity",
            platform="windows",
            cores=8,
            memory=16 << 30,
            flops=1.5e11,
            limits=profile("roblox"),
            codecs=("fp32", "int8"),
            token="secret",
            resume="r-1",
        ),
        Welcome(session_id="s-1", resume_token="r-1", limits=profile("unlimited")),
        Task(
            task_id="t-1",
            model_version=7,
            spec=spec,
            dataset="digits",
            base_version=7,
            optimizer={"name": "sgd", "lr": 0.05, "nesterov": True},
        ),
        Task(
            task_id="t-2",
            kind="evaluate",
            model_version=0,
            spec=spec,
            dataset="digits",
            shard=3,
            indices=np.arange(10, dtype=np.uint32),
            steps=10,
            batch=32,
            seed=2**64 - 1,
            deadline=2.5,
            model_transfer="model-0",
            num_chunks=4,
            upload_codec="int8",
        ),
        Result(task_id="t-1", model_version=7),
        Result(
            task_id="t-1",
            model_version=7,
            kind="gradient",
            num_chunks=3,
            loss=0.25,
            samples=160,
            steps=10,
            compute_seconds=0.4,
            metrics={"accuracy": 0.9},
        ),
        Chunk(
            transfer="t-1",
            seq=1,
            total=2,
            layer=0,
            part="W",
            row_start=4,
            row_end=8,
            codec=0,
            crc=123,
            payload=b"\x00" * 16,
        ),
        Ack(task_id="t-1", accepted=False, reason="stale"),
        Prefetch(task_id="t-1"),
        Fetch(data="ab" * 32),
        Fetch(data="0f" * 32, offset=4096),
        Data(data="ab" * 32, offset=8, size=24, payload=b"\x01" * 16),
        Hello(client="web/1", data=True),
        Welcome(session_id="s-2", limits=profile("roblox"), data=True),
        Task(
            task_id="t-3",
            model_version=1,
            spec=spec,
            dataset="user",
            base_version=1,
            data="0123456789abcdef" * 4,
        ),
        Heartbeat(seq=5, time=12.5, echo=12.25),
        Error(code=int(ErrorCode.BAD_FIELD), message="task.steps: bad"),
        Bye(reason="shutdown"),
        Bye(reason="finished", detail="max_versions"),
        Decline(task_id="t-1", reason="compute: ValueError: unknown optimizer 'lamb'"),
        Decline(task_id="t-2"),
        Welcome(session_id="s-3", limits=profile("roblox"), prefetch=True, decline=True),
    ]


@pytest.mark.parametrize("msg", examples(), ids=lambda m: m.TYPE)
def test_round_trip(msg):
    frame = encode(msg)
    back = decode(frame)
    assert type(back) is type(msg)
    assert back == msg
    assert encode(back) == frame  # canonical: decode∘encode is a fixed point


def test_every_type_has_an_example():
    assert {m.TYPE for m in examples()} == set(MESSAGE_TYPES)


def test_chunk_fast_path_gives_the_generic_bytes():
    for n in (0, 5, 255, 256, 65535, 65536, 70000):
        c = Chunk(
            transfer="x",
            seq=0,
            total=1,
            layer=0,
            part="b",
            row_start=0,
            row_end=1,
            crc=0,
            payload=memoryview(b"y" * n),
        )
        assert encode(c) == msgpack.packb(c.to_wire(), use_bin_type=True)


def test_limits_infinity_travels_as_nil():
    wire = msgpack.unpackb(encode(Welcome(session_id="s", limits=profile("unlimited"))))
    assert wire["limits"]["bytes_per_s"] is None
    assert decode(encode(Welcome(session_id="s", limits=profile("unlimited")))).limits == profile(
        "unlimited"
    )


def _frame(**wire):
    return msgpack.packb(wire, use_bin_type=True)


def _error(frame, **kw):
    with pytest.raises(ProtocolError) as info:
        decode(frame, **kw)
    return info.value


def test_unknown_or_missing_type():
    assert _error(_frame(type="nope")).code == ErrorCode.UNKNOWN_TYPE
    assert _error(_frame(seq=1)).code == ErrorCode.UNKNOWN_TYPE
    assert _error(_frame(type=3)).code == ErrorCode.UNKNOWN_TYPE


def test_not_a_map_or_not_msgpack_or_trailing_bytes():
    assert _error(msgpack.packb([1, 2])).code == ErrorCode.MALFORMED
    assert _error(b"").code == ErrorCode.MALFORMED
    assert _error(b"\xc1").code == ErrorCode.MALFORMED  # never-used byte
    assert _error(encode(Bye()) + b"\x00").code == ErrorCode.MALFORMED


def test_missing_required_field_names_it():
    err = _error(_frame(type="ack", accepted=True))
    assert err.code == ErrorCode.BAD_FIELD
    assert err.message == "ack.task_id: missing required field"


@pytest.mark.parametrize(
    ("wire", "field"),
    [
        ({"type": "heartbeat", "seq": "x"}, "heartbeat.seq"),
        ({"type": "heartbeat", "seq": True}, "heartbeat.seq"),
        ({"type": "heartbeat", "seq": -1}, "heartbeat.seq"),
        ({"type": "heartbeat", "seq": 1, "time": math.nan}, "heartbeat.time"),
        ({"type": "ack", "task_id": "t", "accepted": 1}, "ack.accepted"),
        ({"type": "ack", "task_id": "", "accepted": True}, "ack.task_id"),
        ({"type": "ack", "task_id": "t" * 129, "accepted": True}, "ack.task_id"),
        ({"type": "hello", "client": "c", "cores": 0}, "hello.cores"),
        ({"type": "hello", "client": "c", "codecs": ["fp32", 1]}, "hello.codecs[1]"),
        ({"type": "hello", "client": "c", "limits": {"bytes_per_s": 1}}, "hello.limits"),
        ({"type": "error", "code": 70000}, "error.code"),
        ({"type": "result", "task_id": "t", "model_version": 0, "kind": "x"}, "result.kind"),
        ({"type": "result", "task_id": "t", "model_version": 0, "metrics": {"a": "b"}}, "metrics"),
    ],
)
def test_bad_field_is_named(wire, field):
    err = _error(_frame(**wire))
    assert err.code == ErrorCode.BAD_FIELD
    assert field in err.message


def _task_wire(**changes):
    t = Task(
        task_id="t",
        model_version=1,
        spec=ModelSpec.preset("tiny"),
        dataset="d",
        num_chunks=2,
        model_transfer="m",
    )
    wire = t.to_wire()
    wire.update(changes)
    return wire


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"steps": 0}, "task.steps"),
        ({"kind": "mine"}, "task.kind"),
        ({"spec": {"widths": [3]}}, "task.spec.widths"),
        ({"spec": {"widths": [3, 2], "loss": "hinge"}}, "task.spec"),
        ({"spec": {"widths": [3, 0]}}, "task.spec.widths[1]"),
        ({"model_transfer": None}, "task.model_transfer"),
        ({"num_chunks": 0}, "task.num_chunks"),
        ({"num_chunks": 0, "base_version": 1}, "task.num_chunks"),
        ({"indices": np.array([[1]], dtype=np.uint32)}, "task.indices"),
        ({"indices": np.array([-1], dtype=np.int32)}, "task.indices"),
        ({"indices": np.array([1.0], dtype=np.float32)}, "task.indices"),
        ({"optimizer": {"lr": [1]}}, "task.optimizer.lr"),
        ({"boundary": 0}, "task.boundary"),
        ({"boundary": 9}, "task.boundary"),  # tiny has fewer hidden layers
        ({"boundary": 1, "kind": "gradient"}, "task.boundary"),
        ({"boundary": True}, "task.boundary"),
    ],
)
def test_task_validation(changes, field):
    frame = msgpack.packb(_task_wire(**changes), default=pack_ndarray)
    err = _error(frame)
    assert err.code == ErrorCode.BAD_FIELD
    assert field in err.message


def test_chunk_cross_field_checks():
    base = examples()[7].to_wire()
    assert "chunk.seq" in _error(_frame(**{**base, "seq": 2})).message
    assert "chunk.row_end" in _error(_frame(**{**base, "row_end": 4})).message


def test_error_messages_stay_short_for_huge_values():
    err = _error(_frame(type="ack", task_id="x" * 1_000_000, accepted=True))
    assert len(err.message) < 200
    err = _error(_frame(type="ack", task_id=b"\x00" * 1_000_000, accepted=True))
    assert "<1000000 bytes>" in err.message
    assert len(_error(_frame(type="z" * 100_000)).message) < 200


def test_choose_version():
    assert choose_version(PROTOCOL_VERSION) == PROTOCOL_VERSION
    assert choose_version(99) == max(SUPPORTED_VERSIONS)
    with pytest.raises(ProtocolError) as info:
        choose_version(0)
    assert info.value.code == ErrorCode.UNSUPPORTED_VERSION


def test_unknown_fields_are_ignored_for_forward_compatibility():
    msg = decode(_frame(type="bye", reason="x", future_field={"a": [1, 2]}))
    assert msg == Bye(reason="x")


def test_max_bytes_is_enforced_before_parsing():
    frame = encode(Bye(reason="x" * 100))
    assert _error(frame, max_bytes=50).code == ErrorCode.TOO_LARGE
    assert decode(frame, max_bytes=len(frame)) == Bye(reason="x" * 100)


def test_constructing_a_bad_message_is_the_callers_value_error():
    with pytest.raises(ValueError, match=r"heartbeat\.seq"):
        Heartbeat(seq=-1)
    with pytest.raises(ValueError, match=r"task\.model_transfer"):
        Task(task_id="t", model_version=0, spec=ModelSpec.preset("tiny"), dataset="d", num_chunks=1)
    assert Hello(client="x").version == PROTOCOL_VERSION


HOSTILE = [
    b"\xdd\xff\xff\xff\xff",  # array32 claiming 4 G elements
    b"\xdf\xff\xff\xff\xff",  # map32 claiming 4 G entries
    b"\xc6\xff\xff\xff\xff",  # bin32 claiming 4 GB
    b"\xdb\x7f\xff\xff\xff",  # str32 claiming 2 GB
    b"\xc9\x7f\xff\xff\xff\x01",  # ext32 claiming 2 GB
    b"\x91" * 100_000,  # 100 000 nested arrays
    b"\xdc\xff\xff" + b"\x90" * 65535,  # 64 Ki empty arrays
    b"\xdc\xff\xff" + b"\x80" * 65535,  # 64 Ki empty maps: the worst expansion (72x)
    b"\xde\xff\xff" + b"\x00\x80" * 30000,  # map with int keys
]


@pytest.mark.parametrize("frame", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_frames_are_rejected_with_bounded_memory(frame):
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError):
            decode(frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 100 * len(frame) + 256 * 1024


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_arbitrary_bytes_raise_only_protocol_error(data):
    try:
        msg = decode(data)
    except ProtocolError:
        return
    assert msg.TYPE in MESSAGE_TYPES


@settings(max_examples=300)
@given(
    st.sampled_from([encode(m) for m in examples()]),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
)
def test_corrupted_valid_frames_raise_only_protocol_error(frame, flips):
    buf = bytearray(frame)
    for pos, val in flips:
        buf[pos % len(buf)] = val
    try:
        msg = decode(bytes(buf))
    except ProtocolError:
        return
    assert encode(msg)  # whatever decoded is a valid message that re-encodes


def test_sparse_keys_stay_off_the_wire_at_their_default():
    """Keys added within version 1 (task.data, hello.data, welcome.data, chunk.blocks)
    leave a frame that does not use them byte-identical to the one before them."""
    spec = ModelSpec.preset("tiny")
    task = Task(task_id="1", model_version=0, spec=spec, dataset="d", base_version=0)
    assert "data" not in task.to_wire()
    with_data = Task(
        task_id="1", model_version=0, spec=spec, dataset="d", base_version=0, data="a" * 64
    )
    assert with_data.to_wire()["data"] == "a" * 64
    assert decode(encode(with_data)) == with_data
    assert "data" not in Hello(client="c").to_wire()
    assert Hello(client="c", data=True).to_wire()["data"] is True


@pytest.mark.parametrize(
    "wire, field",
    [
        ({"type": "fetch", "data": "A" * 64}, "fetch.data"),
        ({"type": "fetch", "data": "ab"}, "fetch.data"),
        ({"type": "data", "data": "a" * 64, "offset": 10, "size": 12, "payload": b"123"},
         "data.payload"),
        ({"type": "task", "task_id": "1", "model_version": 0, "dataset": "d",
          "spec": {"widths": [2, 2]}, "base_version": 0, "data": "xyz"}, "task.data"),
    ],
)  # fmt: skip
def test_bad_data_fields_name_the_field(wire, field):
    with pytest.raises(ProtocolError) as err:
        decode(msgpack.packb(wire, use_bin_type=True))
    assert err.value.code is ErrorCode.BAD_FIELD
    assert field in err.value.message


def test_decline_and_bye_detail_are_sparse_and_finished_is_a_word():
    """welcome.decline and bye.detail (added within version 1) stay off the wire at
    their defaults: a server that does not set them sends the frames it always did."""
    limits = profile("roblox")
    assert "decline" not in Welcome(session_id="s", limits=limits).to_wire()
    assert Welcome(session_id="s", limits=limits, decline=True).to_wire()["decline"] is True
    assert encode(Bye(reason="x")) == msgpack.packb({"type": "bye", "reason": "x"})
    bye = decode(encode(Bye(reason="finished", detail="max_time")))
    assert bye.finished and bye.detail == "max_time"
    assert not Bye(reason="going away").finished
    assert list(Decline(task_id="7").to_wire()) == ["type", "task_id", "reason"]


@pytest.mark.parametrize(
    "wire, field",
    [
        ({"type": "decline", "reason": "compute"}, "decline.task_id"),
        ({"type": "decline", "task_id": "", "reason": "compute"}, "decline.task_id"),
        ({"type": "decline", "task_id": "1", "reason": "x" * 257}, "decline.reason"),
        ({"type": "welcome", "session_id": "s", "decline": 1,
          "limits": {"bytes_per_s": None, "messages_per_s": None,
                     "max_message_bytes": 4096}}, "welcome.decline"),
    ],
)  # fmt: skip
def test_bad_decline_fields_name_the_field(wire, field):
    with pytest.raises(ProtocolError) as err:
        decode(msgpack.packb(wire, use_bin_type=True))
    assert err.value.code is ErrorCode.BAD_FIELD
    assert field in err.value.message


def test_a_boundary_task_round_trips_and_hello_says_it_returns_boundaries():
    frame = msgpack.packb(_task_wire(boundary=1), default=pack_ndarray)
    assert decode(frame).boundary == 1
    assert "boundary" not in Task.from_wire(_task_wire()).to_wire()  # sparse: off by default
    hello = Hello(client="c", boundary=True)
    assert decode(encode(hello)).boundary is True


def test_hello_kernel_names_a_kernel_family_and_is_sparse():
    """hello.kernel (§3.1): left off the wire when unknown, so an older hello's
    bytes are unchanged; a short lower-case token, a family not known yet included."""
    assert "kernel" not in Hello(client="c").to_wire()
    for family in KERNELS:
        assert decode(encode(Hello(client="c", kernel=family))).kernel == family
    assert decode(encode(Hello(client="c", kernel="webgpu-f16"))).kernel == "webgpu-f16"
    assert decode(msgpack.packb({"type": "hello", "client": "c"})).kernel == ""


@pytest.mark.parametrize("kernel", ["JS", "js f64", "x" * 33, 7, None, "wasm_simd"])
def test_hello_kernel_refuses_anything_but_a_short_token(kernel):
    with pytest.raises(ProtocolError) as err:
        decode(msgpack.packb({"type": "hello", "client": "c", "kernel": kernel}))
    assert err.value.code is ErrorCode.BAD_FIELD
    assert "hello.kernel" in err.value.message
