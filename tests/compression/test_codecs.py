"""Codec round trips, error bounds, exact sizes, and rejection of corrupt payloads."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import compression
from compression import CodecError, CodecId, get
from compression.codecs import _BY_ID

ALL = [
    *compression.names(),
    "int8-sr",
    "int8-chunk-sr",
    "int4-sr",
    "int4-chunk-sr",
    "int2-sr",
    "topk:0.1",
    "topk:0.5",
    "topk:1",
    "topk:0.1+int8",
    "topk:0.1+int8-sr",
]

floats = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=32)
shapes = st.one_of(
    hnp.array_shapes(min_dims=1, max_dims=1, min_side=0, max_side=40),
    hnp.array_shapes(min_dims=2, max_dims=2, min_side=0, max_side=12),
)
blocks = shapes.flatmap(lambda s: hnp.arrays(np.float32, s, elements=floats))


def test_every_wire_id_has_one_codec() -> None:
    assert sorted(_BY_ID) == sorted(int(c) for c in CodecId)
    for cid in CodecId:
        assert get(int(cid)).id == cid


def test_unknown_names_are_codec_errors() -> None:
    for bad in ["int7", "topk:0", "topk:1.5", "topk:abc", "topk:0.1-sr", "", "fp8"]:
        with pytest.raises(CodecError):
            get(bad)
    with pytest.raises(CodecError):
        get(99)


def test_parameterised_names_share_the_wire_id() -> None:
    assert get("topk:0.1").id == CodecId.TOPK
    assert get("topk:0.1+int8-sr").id == CodecId.TOPK_INT8
    assert get("int8-sr").id == CodecId.INT8
    assert get("topk:0.1") is get("topk:0.1")


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=60, deadline=None)
@given(x=blocks)
def test_round_trip_size_and_error_bound(name: str, x: np.ndarray) -> None:
    codec = get(name)
    payload = codec.encode(x, rng=np.random.default_rng(1))
    assert len(payload) == codec.encoded_size(x.shape)
    # the registered instance of the wire id decodes every variant
    y = get(int(codec.id)).decode(payload, x.shape)
    assert y.shape == x.shape and y.dtype == np.float32
    err = np.abs(y - x)
    if codec.lossless:
        assert np.array_equal(y, x)
    elif name == "fp16":
        assert (err <= np.maximum(np.abs(x) * 2.0**-11, 2.0**-25)).all()
    elif name.startswith("int"):
        levels = {"int8": 127, "int4": 7, "int2": 1}[name[:4]]
        per_row = "-chunk" not in name
        if x.size:
            rows = x.reshape(x.shape[0], -1) if (per_row and x.ndim == 2) else x.reshape(1, -1)
            erows = err.reshape(rows.shape)
            scale = np.abs(rows).max(axis=1, keepdims=True) / levels
            slack = 1.0 if name.endswith("-sr") else 0.5
            assert (erows <= scale * slack * (1 + 1e-5) + 1e-30).all()
    else:  # top-k: kept values exact (or int8-exact), dropped ones at most the smallest kept
        flat, out = x.reshape(-1), y.reshape(-1)
        k = int(np.frombuffer(payload[:4], "<u4")[0])
        assert k == compression.topk.kept(flat.size, codec.fraction)
        if k:
            kept_mask = np.zeros(flat.size, bool)
            kept_mask[np.frombuffer(payload, "<u4", count=k, offset=4)] = True
            threshold = np.abs(flat[kept_mask]).min()
            assert (np.abs(flat[~kept_mask]) <= threshold).all()
            if "+int8" in name:
                scale = np.abs(flat[kept_mask]).max() / 127
                assert (err[kept_mask.reshape(x.shape)] <= scale * (1 + 1e-5) + 1e-30).all()
            else:
                assert np.array_equal(out[kept_mask], flat[kept_mask])


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_garbage_is_rejected_with_codec_error_only(name: str, data: st.DataObject) -> None:
    codec = get(name)
    shape = data.draw(shapes)
    size = codec.encoded_size(shape)
    # either arbitrary bytes or bytes of exactly the expected length (reach the validators)
    length = data.draw(st.one_of(st.integers(0, 2 * size + 8), st.just(size)))
    payload = data.draw(st.binary(min_size=length, max_size=length))
    try:
        y = codec.decode(payload, shape)
    except CodecError:
        return
    assert y.shape == shape
    if name != "fp32":  # fp32 is a raw view; the update validator checks finiteness
        assert np.isfinite(y).all()


@pytest.mark.parametrize("name", ALL)
def test_truncated_and_extended_payloads_are_rejected(name: str) -> None:
    codec = get(name)
    x = np.random.default_rng(0).standard_normal((6, 9)).astype(np.float32)
    payload = codec.encode(x)
    for bad in (payload[:-1], payload + b"\0", b""):
        with pytest.raises(CodecError):
            codec.decode(bad, x.shape)
    with pytest.raises(CodecError):
        codec.decode(payload, (6, 9, 1))


def test_specific_corruptions() -> None:
    x = np.arange(1, 11, dtype=np.float32)
    p = bytearray(get("int8").encode(x))
    p[4] = 0x80  # -128
    with pytest.raises(CodecError, match="-128"):
        get("int8").decode(bytes(p), x.shape)
    p = bytearray(get("int8").encode(x))
    p[0:4] = np.float32(np.nan).tobytes()
    with pytest.raises(CodecError, match="scale"):
        get("int8").decode(bytes(p), x.shape)
    p = bytearray(get("int4").encode(x[:9]))
    p[-1] |= 0xF0  # nonzero pad nibble
    with pytest.raises(CodecError, match="pad"):
        get("int4").decode(bytes(p), (9,))
    p = bytearray(get("int2").encode(x[:9]))
    p[-1] |= 0x0C  # nonzero pad crumb (value 9 of 12)
    with pytest.raises(CodecError, match="pad"):
        get("int2").decode(bytes(p), (9,))
    p = bytearray(get("int2").encode(x[:8]))
    p[-1] &= 0xF3  # crumb 0 where value 5 was
    with pytest.raises(CodecError, match="crumb 0"):
        get("int2").decode(bytes(p), (8,))
    t = get("topk:0.3")
    p = bytearray(t.encode(x))
    p[4:8], p[8:12] = p[8:12], p[4:8]  # indices out of order
    with pytest.raises(CodecError, match="increasing"):
        t.decode(bytes(p), x.shape)
    p = bytearray(t.encode(x))
    p[12:16] = np.uint32(10).tobytes()  # last index == n
    with pytest.raises(CodecError, match="increasing"):
        t.decode(bytes(p), x.shape)


def test_encoder_rejects_bad_input() -> None:
    for name in ALL:
        if name == "fp32":
            continue
        with pytest.raises(CodecError, match="non-finite"):
            get(name).encode(np.array([1.0, np.inf], np.float32))
    with pytest.raises(CodecError, match="float32"):
        get("int8").encode(np.zeros(3, np.float64))
    with pytest.raises(CodecError, match="3-D"):
        get("int8").encode(np.zeros((2, 2, 2), np.float32))


@pytest.mark.parametrize(("name", "levels"), [("int4-chunk-sr", 7), ("int2-sr", 1)])
def test_stochastic_rounding_is_unbiased_and_seeded(name: str, levels: int) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal(1000).astype(np.float32)
    codec = get(name)
    mean = np.mean([codec.decode(codec.encode(x, rng=rng), x.shape) for _ in range(400)], axis=0)
    scale = np.abs(x).max() / levels
    # deterministic rounding would leave errors up to scale/2; the average shrinks them
    assert np.abs(mean - x).max() < 0.2 * scale
    a = codec.encode(x, rng=np.random.default_rng(5))
    assert a == codec.encode(x, rng=np.random.default_rng(5))
    assert codec.encode(x) == codec.encode(x)  # no rng: seeded by the block itself
    assert a != get(name[:-3]).encode(x)


def test_compression_ratios_on_a_large_block() -> None:
    shape = (1024, 1024)
    fp32 = get("fp32").encoded_size(shape)
    assert fp32 / get("fp16").encoded_size(shape) == 2
    assert fp32 / get("int8").encoded_size(shape) > 3.98
    assert fp32 / get("int4").encoded_size(shape) > 7.9
    assert fp32 / get("int2").encoded_size(shape) > 15.7
    assert fp32 / get("topk:0.01").encoded_size(shape) > 49
    assert fp32 / get("topk:0.01+int8").encoded_size(shape) > 79
