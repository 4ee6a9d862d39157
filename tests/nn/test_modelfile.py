import json

import numpy as np
import pytest

from compression.quantize import is_quantized_file, load_quantized, quantize_model
from nn.modelfile import load_model, save_model, write_npz
from nn.spec import ModelSpec


@pytest.fixture
def params():
    return ModelSpec.preset("small").init_params(4)


def test_round_trip_with_extras_and_metadata(params, tmp_path):
    extra = {"velocity": np.arange(5, dtype=np.float64)}
    path = save_model(tmp_path / "m.npz", params, extra=extra, metadata={"acc": 0.97})
    assert list(tmp_path.iterdir()) == [path]  # the temp file was renamed away
    back, got_extra, meta = load_model(path)
    assert back.array_equal(params) and back.spec == params.spec
    assert set(got_extra) == {"velocity"} and np.array_equal(
        got_extra["velocity"], extra["velocity"]
    )
    assert meta == {"acc": 0.97}


@pytest.mark.parametrize("name", ["W0", "b1", "__header__"])
def test_extra_names_may_not_shadow_the_model(params, tmp_path, name):
    with pytest.raises(ValueError, match=f"extra array name '{name}'"):
        save_model(tmp_path / "m.npz", params, extra={name: np.zeros(1)})


def test_bad_files_name_their_fault(params, tmp_path):
    missing = tmp_path / "missing.npz"
    with pytest.raises(ValueError, match=r"missing\.npz: not a readable model file"):
        load_model(missing)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip at all")
    with pytest.raises(ValueError, match=r"junk\.npz: not a readable model file"):
        load_model(junk)
    bare = tmp_path / "bare.npz"
    np.savez(bare, W0=np.zeros(2))
    with pytest.raises(ValueError, match=r"bare.npz: not a crowdgrad model file \(no header\)"):
        load_model(bare)
    broken = tmp_path / "broken.npz"
    np.savez(broken, __header__=np.frombuffer(b"{not json", np.uint8))
    with pytest.raises(ValueError, match=r"broken\.npz: corrupt header"):
        load_model(broken)
    future = write_npz(
        tmp_path / "future.npz", {"format": "crowdgrad-model", "format_version": 9}, {}
    )
    with pytest.raises(
        ValueError, match=r"format 'crowdgrad-model' v9, expected 'crowdgrad-model' v1"
    ):
        load_model(future)
    short = tmp_path / "short.npz"
    header = json.dumps(
        {"format": "crowdgrad-model", "format_version": 1, "spec": params.spec.to_dict()}
    )
    np.savez(short, __header__=np.frombuffer(header.encode(), np.uint8), W0=params.W[0])
    with pytest.raises(ValueError, match="missing W0 or b0"):
        load_model(short)


def test_plain_and_quantized_files_are_never_mistaken_for_each_other(params, tmp_path):
    plain = save_model(tmp_path / "plain.npz", params)
    q = quantize_model(params).save(tmp_path / "q.npz", metadata={"bits": 8})
    assert is_quantized_file(q) and not is_quantized_file(plain)
    assert not is_quantized_file(tmp_path / "missing.npz")
    with pytest.raises(
        ValueError, match="format 'crowdgrad-qmodel' v1, expected 'crowdgrad-model'"
    ):
        load_model(q)
    with pytest.raises(
        ValueError, match="format 'crowdgrad-model' v1, expected 'crowdgrad-qmodel'"
    ):
        load_quantized(plain)
    model, meta = load_quantized(q)
    assert meta == {"bits": 8} and model.spec == params.spec
