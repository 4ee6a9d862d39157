"""Parameters in a mapped file (nn/mapped.py): version 0 as init_params writes it,
changes reach the file, a wrong-sized file is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nn.mapped import create_mapped, open_mapped
from nn.spec import ModelSpec


@pytest.mark.parametrize("widths", [(5, 3, 2), (10, 2500, 7, 3)])
def test_version_zero_is_init_params_bit_for_bit(tmp_path: Path, widths: tuple) -> None:
    spec = ModelSpec(widths=widths)
    mapped = create_mapped(tmp_path / "m.f32", spec, seed=7)
    assert isinstance(mapped.data, np.memmap)
    assert mapped.array_equal(spec.init_params(7))


def test_writes_reach_the_file_and_a_wrong_file_is_refused(tmp_path: Path) -> None:
    spec = ModelSpec(widths=(4, 6, 2))
    path = tmp_path / "m.f32"
    p = create_mapped(path, spec, seed=1)
    p.W[1][0, 0] = 42.0
    p.data.flush()
    again = open_mapped(path, spec, writable=False)
    assert again.W[1][0, 0] == 42.0
    with pytest.raises(ValueError, match="needs"):
        open_mapped(path, ModelSpec(widths=(4, 7, 2)))
