"""A user's dataset from a file (``.npz`` or ``.csv``), checked before anything runs.

An operator brings data as a file named in the job (``[data] path``); a mistake
in it must be a clear error when the job loads, naming the file and what is
wrong, never a traceback after the coordinator has printed its join URL.

- ``.npz``: arrays ``X`` (2-D, real numbers) and ``y`` (1-D integer class
  labels, or float regression targets, 1-D or 2-D).
- ``.csv``: a header row; the column named by ``label`` is ``y`` (integers:
  class labels; anything else: one float target), every other column a float
  feature. No quoting, no missing values.

The test split is cut as for the built-in datasets (``nn.data.split_indices``).
``check_against`` holds the data to a model: input width, and classes within
the output width (softmax_ce) or targets of the output width (mse).
"""

from __future__ import annotations

import csv
import zipfile
from pathlib import Path

import numpy as np

from nn.data import Dataset, split_indices
from nn.spec import ModelSpec


class DataFileError(ValueError):
    """A data file that cannot be used; the message names the file and the fault."""


def load_file(
    path: str | Path, *, label: str | None = None, test_fraction: float = 0.25, seed: int = 0
) -> Dataset:
    """Read, check and split a ``.npz`` or ``.csv`` file into train and test rows."""
    p = Path(path)
    if not p.is_file():
        raise DataFileError(f"{p}: no such file")
    suffix = p.suffix.lower()
    if suffix == ".npz":
        if label is not None:
            raise DataFileError(f"{p}: 'label' is for .csv files; a .npz has arrays X and y")
        X, y = _read_npz(p)
    elif suffix == ".csv":
        if not label:
            raise DataFileError(f"{p}: a .csv needs data.label, the name of its label column")
        X, y = _read_csv(p, label)
    else:
        raise DataFileError(f"{p}: unknown data file type {suffix!r}; expected .npz or .csv")
    X, y, classes = _check_arrays(p, X, y)
    if X.shape[0] < 2:
        raise DataFileError(f"{p}: {X.shape[0]} row(s); need at least 2 (train and test)")
    tr, te = split_indices(X.shape[0], test_fraction, seed)
    return Dataset(
        name=p.stem,
        X_train=X[tr],
        y_train=y[tr],
        X_test=X[te],
        y_test=y[te],
        num_classes=classes,
    )


def check_against(data: Dataset, spec: ModelSpec, *, source: str = "data") -> None:
    """Raise DataFileError unless ``spec`` can train on ``data``."""
    features, out = spec.widths[0], spec.widths[-1]
    if data.num_features != features:
        raise DataFileError(
            f"{source}: rows have {data.num_features} features, the model's input width "
            f"is {features} (model.widths[0])"
        )
    if data.num_classes is not None:
        if data.num_classes > out:
            raise DataFileError(
                f"{source}: labels run to {data.num_classes - 1} ({data.num_classes} classes), "
                f"the model has {out} outputs (model.widths[-1])"
            )
        return
    if spec.loss == "softmax_ce":
        raise DataFileError(
            f"{source}: float targets need loss = 'mse'; softmax_ce needs integer class labels"
        )
    width = 1 if data.y_train.ndim == 1 else data.y_train.shape[1]
    if width != out:
        raise DataFileError(
            f"{source}: targets have width {width}, the model has {out} outputs (model.widths[-1])"
        )


def _read_npz(p: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(p, allow_pickle=False) as z:
            missing = [k for k in ("X", "y") if k not in z.files]
            if missing:
                raise DataFileError(
                    f"{p}: missing array(s) {missing}; the file holds {sorted(z.files)}"
                )
            return z["X"], z["y"]
    except DataFileError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise DataFileError(f"{p}: not a readable .npz ({exc})") from None


def _read_csv(p: Path, label: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        with p.open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError) as exc:
        raise DataFileError(f"{p}: cannot read ({exc})") from None
    if not rows:
        raise DataFileError(f"{p}: empty file")
    header = [h.strip() for h in rows[0]]
    if label not in header:
        raise DataFileError(f"{p}: no column {label!r}; the header has {header}")
    if len(header) < 2:
        raise DataFileError(f"{p}: needs at least one feature column besides {label!r}")
    body = [r for r in rows[1:] if r]
    if not body:
        raise DataFileError(f"{p}: a header and no rows")
    col = header.index(label)
    labels: list[str] = []
    feats = np.empty((len(body), len(header) - 1), np.float64)
    for i, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise DataFileError(f"{p}:{i}: {len(row)} fields, the header has {len(header)}")
        labels.append(row[col].strip())
        try:
            feats[i - 2] = [float(v) for j, v in enumerate(row) if j != col]
        except ValueError:
            bad = next(v for j, v in enumerate(row) if j != col and not _is_float(v))
            raise DataFileError(f"{p}:{i}: feature {bad!r} is not a number") from None
    try:
        y: np.ndarray = np.array([int(v) for v in labels], np.int64)
    except ValueError:
        try:
            y = np.array([float(v) for v in labels], np.float64)
        except ValueError:
            bad = next(v for v in labels if not _is_float(v))
            raise DataFileError(f"{p}: label {bad!r} in column {label!r} is not a number") from None
    return feats, y


def _is_float(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def _check_arrays(
    p: Path, X: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int | None]:
    """X as float32 [n, f]; y as int32 labels (classes = max + 1) or float32 targets."""
    if X.dtype == object or y.dtype == object:
        raise DataFileError(f"{p}: object arrays are not data; store numbers")
    if X.ndim != 2 or X.shape[0] == 0 or X.shape[1] == 0:
        raise DataFileError(f"{p}: X must be a non-empty 2-D array [rows, features], got {X.shape}")
    if not (np.issubdtype(X.dtype, np.number) or X.dtype == bool) or np.iscomplexobj(X):
        raise DataFileError(f"{p}: X must hold real numbers, got dtype {X.dtype}")
    Xf = X.astype(np.float32)
    if not np.isfinite(Xf).all():
        r, c = np.argwhere(~np.isfinite(Xf))[0]
        raise DataFileError(f"{p}: X holds NaN or inf (first at row {r}, column {c})")
    if y.shape[:1] != X.shape[:1]:
        raise DataFileError(f"{p}: y has {y.shape[0] if y.ndim else 0} rows, X has {X.shape[0]}")
    if np.issubdtype(y.dtype, np.integer) or y.dtype == bool:
        if y.ndim != 1:
            raise DataFileError(f"{p}: integer labels y must be 1-D, got shape {y.shape}")
        if int(y.min()) < 0:
            raise DataFileError(f"{p}: label {int(y.min())} is negative; labels are 0, 1, ...")
        classes = int(y.max()) + 1
        if classes > 1 << 20:
            raise DataFileError(f"{p}: label {classes - 1} is too large for a class index")
        return Xf, y.astype(np.int32), classes
    if not np.issubdtype(y.dtype, np.floating):
        raise DataFileError(f"{p}: y must be integer labels or float targets, got dtype {y.dtype}")
    if y.ndim not in (1, 2):
        raise DataFileError(f"{p}: float targets y must be 1-D or 2-D, got shape {y.shape}")
    yf = y.astype(np.float32)
    if not np.isfinite(yf).all():
        raise DataFileError(f"{p}: y holds NaN or inf")
    return Xf, (yf.reshape(-1, 1) if yf.ndim == 1 else yf), None
