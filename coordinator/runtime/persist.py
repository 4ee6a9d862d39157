"""Coordinator state <-> storage checkpoint: ``state_dict()`` is nested, a stored
checkpoint's strategy state is flat (``name -> ndarray | JSON scalar``).

Arrays go into ``Checkpoint.strategy`` under generated keys; the nested
structure around them (dicts with int keys, lists, the rng state's 128-bit
ints) goes into ``metadata["core"]`` as JSON with ``{"$a": key}`` placeholders,
so nothing is pickled and a checkpoint stays inspectable.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from coordinator.core.config import JobConfig
from nn.params import Params
from storage.layout import Checkpoint, LiveParams, ParamsPatch

_ARRAY = "$a"
_DICT = "$d"


def _pack(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(value, np.ndarray):
        key = f"a{len(arrays)}"
        arrays[key] = np.ascontiguousarray(value)
        return {_ARRAY: key}
    if isinstance(value, dict):
        return {_DICT: [[_pack(k, arrays), _pack(v, arrays)] for k, v in value.items()]}
    if isinstance(value, list | tuple):
        return [_pack(v, arrays) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"coordinator state: cannot store a {type(value).__name__}")


def _unpack(value: Any, arrays: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        if _ARRAY in value:
            return np.asarray(arrays[value[_ARRAY]])
        return {_unpack(k, arrays): _unpack(v, arrays) for k, v in value[_DICT]}
    if isinstance(value, list):
        return [_unpack(v, arrays) for v in value]
    return value


def to_checkpoint(
    job: JobConfig,
    state: dict[str, Any],
    *,
    created_at: float,
    history: dict[str, Any] | None = None,
    params: Params | ParamsPatch | LiveParams | None = None,
) -> Checkpoint:
    """A storable checkpoint of ``Coordinator.state_dict()`` (already a copy);
    ``history``: the run's series (coordinator.runtime.history), kept as plain JSON;
    ``params``: used instead of ``state["params"]`` (the changed groups of an
    incremental checkpoint, a mapped model written from its file, or one copied
    while it trains)."""
    rest = {k: v for k, v in state.items() if k != "params"}
    arrays: dict[str, np.ndarray] = {}
    packed = _pack(rest, arrays)
    return Checkpoint(
        version=int(state["version"]),
        created_at=created_at,
        params=params
        if params is not None
        else Params.from_flat(job.spec, np.asarray(state["params"], dtype=np.float32)),
        strategy=arrays,
        metadata={
            "job": job.name,
            "strategy": job.strategy.name,
            "core": packed,
            **({"history": history} if history is not None else {}),
        },
        applied_results=tuple(str(t) for t in state["accepted_tasks"]),
    )


def ending_of(metadata: dict[str, Any]) -> dict[str, Any] | None:
    """Why the run a checkpoint is of had ended (coordinator.core.earlystop.ending),
    read without its arrays; None while it trained (or for a foreign checkpoint)."""
    core = metadata.get("core")
    pairs = core.get(_DICT, []) if isinstance(core, dict) else []
    return next((_unpack(v, {}) for k, v in pairs if k == "finished"), None)


def from_checkpoint(ckpt: Checkpoint, *, params: bool = True) -> dict[str, Any]:
    """The ``state_dict()`` that ``Coordinator.restore`` takes (``params=False``:
    without the model, which the caller restored in place)."""
    core = ckpt.metadata.get("core")
    if core is None:
        raise ValueError(f"checkpoint v{ckpt.version}: not written by a coordinator (no core)")
    state = _unpack(core, dict(ckpt.strategy))
    if params:
        if not isinstance(ckpt.params, Params):
            raise ValueError(f"checkpoint v{ckpt.version}: a patch, not a loaded model")
        state["params"] = ckpt.params.data.copy()
    return state
