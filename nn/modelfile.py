"""A trained model as one portable ``.npz`` file: spec JSON plus ``W{l}``/``b{l}``.

This is the hand-off format between parts that do not share a store: the
checkpoint CLI exports it, ``crowdgrad compress`` reads and writes it, a player's
runtime loads it. Extra arrays (optimizer state, quantisation scales) ride along
under their own names; ``load_model`` returns them untouched.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from nn.params import Params
from nn.spec import ModelSpec

FORMAT = "crowdgrad-model"
FORMAT_VERSION = 1


def write_npz(path: str | os.PathLike[str], header: dict, arrays: dict[str, np.ndarray]) -> Path:
    """``header`` (JSON) plus ``arrays`` as one ``.npz``, atomically: temp file,
    fsync, rename. Shared by every crowdgrad file format built on ``.npz``."""
    path = Path(path)
    if "__header__" in arrays:
        raise ValueError("array name '__header__' is reserved for the file header")
    payload = {"__header__": np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays}
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def read_header(z: np.lib.npyio.NpzFile, path: Path) -> dict:
    """The JSON header of an open ``.npz``; ValueError naming the fault otherwise."""
    if "__header__" not in z.files:
        raise ValueError(f"{path}: not a crowdgrad model file (no header)")
    try:
        header = json.loads(bytes(z["__header__"]).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: corrupt header ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: corrupt header (not a JSON object)")
    return header


@contextmanager
def open_npz(
    path: str | os.PathLike[str], fmt: str, version: int
) -> Iterator[tuple[np.lib.npyio.NpzFile, dict]]:
    """Open a crowdgrad ``.npz`` of format ``fmt`` v``version``: ``(arrays, header)``."""
    path = Path(path)
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable model file ({exc})") from None
    with z:
        header = read_header(z, path)
        if header.get("format") != fmt or header.get("format_version") != version:
            raise ValueError(
                f"{path}: format {header.get('format')!r} v{header.get('format_version')}, "
                f"expected {fmt!r} v{version}"
            )
        yield z, header


def save_model(
    path: str | os.PathLike[str],
    params: Params,
    *,
    extra: dict[str, np.ndarray] | None = None,
    metadata: dict | None = None,
) -> Path:
    """Write ``params`` (and optional named arrays) atomically: temp file, then rename."""
    header = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "spec": params.spec.to_dict(),
        "metadata": metadata or {},
    }
    arrays: dict[str, np.ndarray] = {}
    for li, (W, b) in enumerate(params.layers):
        arrays[f"W{li}"] = W
        arrays[f"b{li}"] = b
    for name, arr in (extra or {}).items():
        if name in arrays or name == "__header__":
            raise ValueError(f"extra array name {name!r} clashes with a model array")
        arrays[name] = np.asarray(arr)
    return write_npz(path, header, arrays)


def load_model(path: str | os.PathLike[str]) -> tuple[Params, dict[str, np.ndarray], dict]:
    """Read a model file: ``(params, extra arrays, metadata)``; a bad file names its fault."""
    with open_npz(path, FORMAT, FORMAT_VERSION) as (z, header):
        spec = ModelSpec.from_dict(header["spec"])
        layers = []
        for li in range(spec.num_layers):
            if f"W{li}" not in z.files or f"b{li}" not in z.files:
                raise ValueError(f"{path}: missing W{li} or b{li}")
            layers.append((z[f"W{li}"], z[f"b{li}"]))
        params = Params.from_layers(spec, layers)
        model_names = {"__header__"} | {f"{p}{li}" for p in "Wb" for li in range(spec.num_layers)}
        extra = {name: z[name] for name in z.files if name not in model_names}
    return params, extra, header.get("metadata", {})
