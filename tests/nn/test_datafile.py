"""User data files: .npz and .csv load, split and match a model, or fail naming the fault."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nn.datafile import DataFileError, check_against, load_file
from nn.spec import ModelSpec


def _npz(tmp_path: Path, name: str = "d.npz", **arrays: np.ndarray) -> Path:
    p = tmp_path / name
    np.savez(p, **arrays)
    return p


def test_npz_with_labels_splits_train_and_test(tmp_path: Path) -> None:
    X = np.arange(40, dtype=np.float64).reshape(20, 2)
    y = np.arange(20) % 3
    ds = load_file(_npz(tmp_path, X=X, y=y), seed=1)
    assert ds.num_classes == 3
    assert ds.X_train.dtype == np.float32 and ds.y_train.dtype == np.int32
    assert len(ds.y_train) + len(ds.y_test) == 20 and len(ds.y_test) == 5
    rows = {tuple(r) for r in np.concatenate([ds.X_train, ds.X_test])}
    assert rows == {tuple(r) for r in X.astype(np.float32)}


def test_csv_with_a_label_column(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    lines = ["a,label,b"] + [f"{i * 0.5},{i % 2},{-i}" for i in range(10)]
    p.write_text("\n".join(lines) + "\n")
    ds = load_file(p, label="label")
    assert ds.num_features == 2 and ds.num_classes == 2
    X = np.concatenate([ds.X_train, ds.X_test])
    assert sorted(X[:, 1].tolist()) == sorted(float(-i) for i in range(10))


def test_float_targets_are_regression(tmp_path: Path) -> None:
    ds = load_file(_npz(tmp_path, X=np.ones((8, 3)), y=np.linspace(0, 1, 8)))
    assert ds.num_classes is None and ds.y_train.shape[1] == 1
    check_against(ds, ModelSpec(widths=(3, 4, 1), loss="mse"))
    with pytest.raises(DataFileError, match="float targets need loss = 'mse'"):
        check_against(ds, ModelSpec(widths=(3, 4, 1)))


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"X": np.ones((4, 2))}, "missing array(s) ['y']"),
        ({"X": np.ones((4, 2)), "y": np.array([0, 1, 2])}, "y has 3 rows, X has 4"),
        ({"X": np.array([[1.0, np.nan]] * 4), "y": np.zeros(4, int)}, "NaN or inf (first at row 0"),
        ({"X": np.ones(4), "y": np.zeros(4, int)}, "X must be a non-empty 2-D array"),
        ({"X": np.ones((4, 2)), "y": np.array([0, -1, 0, 0])}, "label -1 is negative"),
        ({"X": np.array([["a", "b"]] * 4), "y": np.zeros(4, int)}, "X must hold real numbers"),
        ({"X": np.ones((0, 2)), "y": np.zeros(0, int)}, "non-empty"),
        ({"X": np.ones((1, 2)), "y": np.zeros(1, int)}, "need at least 2"),
    ],
)  # fmt: skip
def test_bad_npz_files_name_the_fault(tmp_path: Path, arrays, message: str) -> None:
    with pytest.raises(DataFileError) as err:
        load_file(_npz(tmp_path, **arrays))
    assert message in str(err.value)
    assert "d.npz" in str(err.value)


@pytest.mark.parametrize(
    "text, label, message",
    [
        ("", "y", "empty file"),
        ("a,b\n", "b", "a header and no rows"),
        ("a,b\n1,0\n", "y", "no column 'y'"),
        ("a,y\n1,0\n2\n", "y", "d.csv:3: 1 fields, the header has 2"),
        ("a,y\n1,0\nx,1\n", "y", "feature 'x' is not a number"),
        ("a,y\n1,cat\n2,dog\n", "y", "label 'cat'"),
    ],
)
def test_bad_csv_files_name_the_fault(tmp_path: Path, text: str, label: str, message: str) -> None:
    p = tmp_path / "d.csv"
    p.write_text(text)
    with pytest.raises(DataFileError) as err:
        load_file(p, label=label)
    assert message in str(err.value)


def test_unknown_suffix_missing_file_and_missing_label(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="no such file"):
        load_file(tmp_path / "nope.npz")
    (tmp_path / "d.parquet").write_bytes(b"x")
    with pytest.raises(DataFileError, match=r"expected \.npz or \.csv"):
        load_file(tmp_path / "d.parquet")
    (tmp_path / "d.csv").write_text("a,y\n1,0\n")
    with pytest.raises(DataFileError, match=r"needs data\.label"):
        load_file(tmp_path / "d.csv")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(DataFileError, match=r"not a readable \.npz"):
        load_file(tmp_path / "junk.npz")


def test_check_against_names_the_width_at_fault(tmp_path: Path) -> None:
    ds = load_file(_npz(tmp_path, X=np.ones((8, 20)), y=np.arange(8) % 3))
    check_against(ds, ModelSpec(widths=(20, 32, 3)))
    with pytest.raises(DataFileError, match="20 features, the model's input width is 64"):
        check_against(ds, ModelSpec(widths=(64, 32, 3)))
    with pytest.raises(DataFileError, match="3 classes\\), the model has 2 outputs"):
        check_against(ds, ModelSpec(widths=(20, 32, 2)))
