"""The conformance vectors in tests/vectors, checked in both directions."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from nn.spec import ModelSpec
from protocol.chunking import Reassembler
from protocol.errors import ErrorCode, ProtocolError
from protocol.messages import MESSAGE_TYPES, decode, encode

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
    built = gen.build()
    on_disk = {p.stem for p in VECTORS.glob("*.json")}
    assert set(built) == on_disk
    for name, (frame, doc) in built.items():
        if frame:
            assert (VECTORS / f"{name}.msgpack").read_bytes() == frame, name
        assert json.loads((VECTORS / f"{name}.json").read_text()) == doc, name


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
    want = np.frombuffer(gen.from_json(doc["params_le_f32"]), dtype="<f4")
    assert r.params().data.tobytes() == want.tobytes()
