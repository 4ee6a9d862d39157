from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nn.spec import ModelSpec
from storage import Checkpoint, CorruptCheckpoint
from storage.layout import decode, encode, parse_manifest, seal, sha256_hex


def _roundtrip(ckpt: Checkpoint, max_chunk_bytes: int) -> Checkpoint:
    manifest, chunks = encode(ckpt, max_chunk_bytes)
    blob, digest = seal(manifest, [sha256_hex(*c) for c in chunks])
    stored = [b"".join(bytes(p) for p in c) for c in chunks]
    m = parse_manifest(ckpt.version, blob, digest)
    return decode(ckpt.version, m, iter(enumerate(stored)))


@settings(max_examples=40, deadline=None)
@given(
    widths=st.lists(st.integers(1, 40), min_size=2, max_size=5),
    chunk=st.integers(64, 4096),
    n_opt=st.integers(0, 3000),
    seed=st.integers(0, 2**31),
)
def test_encode_decode_roundtrip(widths: list[int], chunk: int, n_opt: int, seed: int) -> None:
    spec = ModelSpec(widths=tuple(widths))
    if max(widths[:-1]) + 1 > chunk // 4:
        chunk = 4 * (max(widths[:-1]) + 1)
    rng = np.random.default_rng(seed)
    params = spec.init_params(seed)
    opt = {
        "m": rng.standard_normal(n_opt).astype(np.float32),
        "counts": rng.integers(0, 9, size=(3, 7)).astype(np.int64),
        "step": 7,
        "beta": 0.9,
    }
    ckpt = Checkpoint(
        version=3,
        created_at=1.5,
        params=params,
        optimizer=opt,
        strategy={"tau": 10, "name": "dcasgd"},
        metadata={"job": "x"},
        applied_results=("a", "b"),
    )
    _, chunks = encode(ckpt, chunk)
    assert all(sum(p.nbytes for p in c) <= chunk for c in chunks)
    back = _roundtrip(ckpt, chunk)
    assert back.params.array_equal(params)
    assert np.array_equal(back.optimizer["m"], opt["m"])
    assert back.optimizer["counts"].dtype == np.int64
    assert np.array_equal(back.optimizer["counts"], opt["counts"])
    assert back.optimizer["step"] == 7 and back.strategy == {"tau": 10, "name": "dcasgd"}
    assert back.applied_results == ("a", "b") and back.metadata == {"job": "x"}


def test_flipped_byte_is_reported_with_its_chunk() -> None:
    ckpt = Checkpoint(version=1, created_at=0.0, params=ModelSpec.preset("small").init_params(1))
    manifest, chunks = encode(ckpt, 256)
    blob, digest = seal(manifest, [sha256_hex(*c) for c in chunks])
    stored = [bytearray(b"".join(bytes(p) for p in c)) for c in chunks]
    stored[2][5] ^= 0x40
    with pytest.raises(CorruptCheckpoint, match=r"chunk 2 .*checksum"):
        decode(1, parse_manifest(1, blob, digest), iter(enumerate(map(bytes, stored))))
    with pytest.raises(CorruptCheckpoint, match="manifest checksum"):
        parse_manifest(1, blob[:-1] + b" ", digest)
    with pytest.raises(CorruptCheckpoint, match="missing"):
        decode(1, parse_manifest(1, blob, digest), iter(enumerate(map(bytes, stored[:-1]))))


def test_state_values_must_be_arrays_or_json() -> None:
    params = ModelSpec.preset("tiny").init_params(0)
    with pytest.raises(ValueError, match="optimizer state 'bad'"):
        encode(
            Checkpoint(version=0, created_at=0, params=params, optimizer={"bad": object()}), 4096
        )
    with pytest.raises(ValueError, match="object arrays"):
        bad = {"o": np.array([None])}
        encode(Checkpoint(version=0, created_at=0, params=params, strategy=bad), 4096)


def test_a_row_bigger_than_a_chunk_is_a_config_error() -> None:
    params = ModelSpec.preset("large").init_params(0)
    with pytest.raises(ValueError, match="raise the message or chunk size"):
        encode(Checkpoint(version=0, created_at=0, params=params), 1024)
