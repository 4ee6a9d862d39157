"""Datasets for training and tests: digits, teacher tasks, and client shards.

Nothing here downloads: digits is bundled with scikit-learn (read from its file,
without importing scikit-learn), and a teacher task is generated from a seed. A
teacher task exists so that the seed's presets ([10, ..., 10] regressors with no
dataset of their own) learn something measurable: a fixed random MLP of the same
widths labels random inputs, and accuracy is agreement of the argmax with the
teacher's.
"""

from __future__ import annotations

import gzip
import importlib.util
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from nn.spec import ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Dataset:
    """Train and test arrays; ``num_classes`` is None for regression targets."""

    name: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    num_classes: int | None

    @property
    def num_features(self) -> int:
        return int(self.X_train.shape[1])


def split_indices(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded shuffle cut into (train, test) index arrays, both sorted."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    perm = np.random.default_rng(seed).permutation(n)
    n_test = max(1, round(n * test_fraction))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


#: Where scikit-learn keeps the digits, relative to its package directory.
DIGITS_FILE = ("datasets", "data", "digits.csv.gz")


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 digits as scikit-learn's ``load_digits`` returns them: pixels
    float64 in 0..16 ``[1797, 64]``, labels int64.

    Why not ``sklearn.datasets.load_digits``: importing scikit-learn takes most
    of a second and a client's first task (``--no-data-fetch``) or a coordinator's
    start would wait for it; the same CSV file is read here straight from the
    installed package, without importing it. If the file is not where it was
    (another scikit-learn layout), scikit-learn's loader is used after all.
    """
    path = _sklearn_file(*DIGITS_FILE)
    if path is None:
        from sklearn.datasets import load_digits as _sk_digits  # slow import: fallback only

        d = _sk_digits()
        return d.data, d.target
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1], data[:, -1].astype(np.int64)


def _sklearn_file(*parts: str) -> Path | None:
    """A data file inside the installed scikit-learn, found without importing it."""
    spec = importlib.util.find_spec("sklearn")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(root, *parts)
        if path.is_file():
            return path
    return None


def load_digits(*, test_fraction: float = 0.25, seed: int = 0) -> Dataset:
    """scikit-learn's 8x8 digits (1,797 images): X float32 in [0, 1], y int32."""
    pixels, labels = digits_arrays()
    X = (pixels / 16.0).astype(np.float32)
    y = labels.astype(np.int32)
    tr, te = split_indices(len(y), test_fraction, seed)
    return Dataset(
        name="digits", X_train=X[tr], y_train=y[tr], X_test=X[te], y_test=y[te], num_classes=10
    )


def teacher_task(spec: ModelSpec, *, n_train: int, n_test: int, seed: int) -> Dataset:
    """Inputs ~ N(0, 1); targets are a fixed random tanh MLP of ``spec``'s widths.

    The teacher uses tanh so that its outputs stay bounded and vary with every
    input direction; targets are standardised per output so an mse near 1 means
    "learned nothing" for every preset.
    """
    from nn.params import Params
    from nn.train import forward_outputs

    if n_train < 1 or n_test < 1:
        raise ValueError(f"teacher task: n_train and n_test must be >= 1, got {n_train}, {n_test}")
    n_layers = spec.num_layers
    teacher_spec = ModelSpec(
        widths=spec.widths,
        activations=("tanh",) * (n_layers - 1) + ("identity",),
        loss="mse",
        init="xavier",
    )
    # pinned to the legacy init: the built-in datasets' rows must not change with it
    teacher: Params = teacher_spec.init_params(seed, scheme="pcg64")
    rng = np.random.default_rng([seed, 1])
    X = rng.standard_normal((n_train + n_test, spec.widths[0]), dtype=np.float32)
    Y = forward_outputs(teacher, X).astype(np.float64)
    Y = ((Y - Y.mean(axis=0)) / (Y.std(axis=0) + 1e-12)).astype(np.float32)
    return Dataset(
        name=f"teacher:{'-'.join(map(str, spec.widths))}",
        X_train=X[:n_train],
        y_train=Y[:n_train],
        X_test=X[n_train:],
        y_test=Y[n_train:],
        num_classes=None,
    )


def classification_task(rows: int, *, seed: int = 0, test_rows: int = 10_000) -> Dataset:
    """A generated 64-feature, 10-class problem (scikit-learn's ``make_classification``:
    32 informative features, 2 clusters a class, 1 % flipped labels), standardised.
    Big enough that a crowd has something to share: the workload of
    benchmarks/crowd.py beside digits, generated, so nothing is downloaded."""
    from sklearn.datasets import make_classification

    if rows < 100:
        raise ValueError(f"classify: needs at least 100 training rows, got {rows}")
    X, y = make_classification(
        n_samples=rows + test_rows,
        n_features=64,
        n_informative=24,
        n_redundant=8,
        n_classes=10,
        n_clusters_per_class=4,
        class_sep=1.0,
        flip_y=0.01,
        random_state=seed,
    )
    X = ((X - X.mean(axis=0)) / (X.std(axis=0) + 1e-12)).astype(np.float32)
    y = y.astype(np.int32)
    return Dataset(
        name=f"classify:{rows}",
        X_train=X[:rows],
        y_train=y[:rows],
        X_test=X[rows:],
        y_test=y[rows:],
        num_classes=10,
    )


def load_dataset(name: str, *, seed: int = 0, **kw: object) -> Dataset:
    """``"digits"``, ``"teacher:<preset>"`` or ``"classify:<rows>"`` (kw go to the
    loader; teacher sizes default to 4,096 train and 1,024 test rows)."""
    if name == "digits":
        return load_digits(seed=seed, **kw)  # type: ignore[arg-type]
    if name.startswith("classify:"):
        count = name.removeprefix("classify:")
        if not count.isdigit():
            raise ValueError(f"dataset {name!r}: expected 'classify:<rows>', e.g. classify:200000")
        if kw:
            raise ValueError(f"dataset {name!r}: unknown option(s) {sorted(kw)}")
        return classification_task(int(count), seed=seed)
    if name.startswith("teacher:"):
        spec = ModelSpec.preset(name.removeprefix("teacher:"))
        n_train = int(kw.pop("n_train", 4096))  # type: ignore[call-overload]
        n_test = int(kw.pop("n_test", 1024))  # type: ignore[call-overload]
        if kw:
            raise ValueError(f"dataset {name!r}: unknown option(s) {sorted(kw)}")
        ds = teacher_task(spec, n_train=n_train, n_test=n_test, seed=seed)
        return replace(ds, name=name)
    raise ValueError(
        f"dataset: unknown dataset {name!r}; expected 'digits', 'teacher:<preset>' "
        "or 'classify:<rows>'"
    )


def shard(
    y: np.ndarray, k: int, *, kind: str = "iid", seed: int = 0, classes_per_shard: int = 2
) -> list[np.ndarray]:
    """Split sample indices into ``k`` client shards; each sample in exactly one.

    ``iid``: a seeded shuffle cut into near-equal parts. ``label_skew``: each shard
    is dealt ``classes_per_shard`` classes (round-robin over a shuffled class
    order) and each class is divided among the shards that hold it, the usual
    pathological non-iid split. Float targets use their argmax as the label.
    """
    y = np.asarray(y)
    n = y.shape[0] if y.ndim else 0
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise ValueError(f"shard: k must be an integer >= 1, got {k!r}")
    if k > n:
        raise ValueError(f"shard: cannot split {n} samples into {k} non-empty shards")
    rng = np.random.default_rng(seed)
    if kind == "iid":
        return [np.sort(part) for part in np.array_split(rng.permutation(n), k)]
    if kind != "label_skew":
        raise ValueError(f"shard: unknown kind {kind!r}; expected 'iid' or 'label_skew'")
    labels = y.argmax(axis=1) if y.ndim == 2 else y
    classes = rng.permutation(np.unique(labels))
    if classes_per_shard < 1:
        raise ValueError(f"shard: classes_per_shard must be >= 1, got {classes_per_shard}")
    holders: dict[int, list[int]] = {int(c): [] for c in classes}
    slot = 0
    for s in range(k):
        for _ in range(classes_per_shard):
            holders[int(classes[slot % len(classes)])].append(s)
            slot += 1
    # A class nobody drew (k * classes_per_shard < classes) goes to shards in turn.
    for hs in holders.values():
        if not hs:
            hs.append(slot % k)
            slot += 1
    parts: list[list[np.ndarray]] = [[] for _ in range(k)]
    for c, hs in holders.items():
        members = rng.permutation(np.flatnonzero(labels == c))
        for s, chunk in zip(hs, np.array_split(members, len(hs)), strict=True):
            parts[s].append(chunk)
    shards = [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in parts]
    if any(s.size == 0 for s in shards):
        raise ValueError(
            f"shard: label_skew left a shard empty ({k} shards, {len(classes)} classes, "
            f"{classes_per_shard} per shard); use fewer shards or more classes per shard"
        )
    return shards
