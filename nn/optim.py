"""Optimizers: a frozen configuration and the mutable state that goes with a model.

The configuration travels (job files, task messages), so it is a small frozen
dataclass with ``to_dict``/``from_dict``. The state (step count and flat float32
buffers laid out like ``Params.data``) is saved and restored next to the params:
``state_dict`` returns plain scalars and numpy arrays that storage can write
as-is. The update rules themselves live in ``nn.kernels`` (they are fused into
the train loop); see ``optimizer_update_`` for the formulas, which follow torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from nn.spec import ModelSpec

#: Optimizer kinds, in the order of ``nn.kernels.OPT_CODES`` (kept import-light: no numba).
OPT_CODES = ("sgd", "momentum", "adam")

#: Which flat buffers each optimizer keeps.
BUFFERS: dict[str, tuple[str, ...]] = {"sgd": (), "momentum": ("velocity",), "adam": ("m", "v")}


@dataclass(frozen=True, slots=True, kw_only=True)
class Optimizer:
    """Optimizer configuration; validated on construction so bad jobs fail early."""

    kind: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.9
    nesterov: bool = False
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.kind not in OPT_CODES:
            raise ValueError(f"optimizer: unknown kind {self.kind!r}; expected one of {OPT_CODES}")
        for name in ("lr", "momentum", "beta1", "beta2", "eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"optimizer: {name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"optimizer: {name} must be finite, got {value!r}")
        if self.lr <= 0:
            raise ValueError(f"optimizer: lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"optimizer: momentum must be in [0, 1), got {self.momentum}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"optimizer: {name} must be in [0, 1), got {getattr(self, name)}")
        if self.eps <= 0:
            raise ValueError(f"optimizer: eps must be > 0, got {self.eps}")
        if not isinstance(self.nesterov, bool):
            raise ValueError(f"optimizer: nesterov must be a bool, got {self.nesterov!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Optimizer:
        """Inverse of ``to_dict``; unknown keys are an error, not silently dropped."""
        allowed = {f.name for f in fields(cls)}
        extra = set(d) - allowed
        if extra:
            raise ValueError(f"optimizer: unknown field(s) {sorted(extra)}")
        return cls(**dict(d))


class OptState:
    """Step count and flat buffers (``velocity`` or ``m``/``v``) of one model."""

    __slots__ = ("buffers", "optimizer", "step")

    def __init__(
        self, optimizer: Optimizer, step: int = 0, buffers: dict[str, np.ndarray] | None = None
    ) -> None:
        self.optimizer = optimizer
        self.step = int(step)
        self.buffers: dict[str, np.ndarray] = buffers if buffers is not None else {}

    @classmethod
    def init(cls, optimizer: Optimizer, spec: ModelSpec) -> OptState:
        n = spec.num_params
        return cls(
            optimizer, 0, {name: np.zeros(n, np.float32) for name in BUFFERS[optimizer.kind]}
        )

    def state_dict(self) -> dict[str, Any]:
        """Plain scalars and arrays; buffers are ``buffer.<name>`` (copies)."""
        d: dict[str, Any] = {"optimizer": self.optimizer.to_dict(), "step": self.step}
        for name, buf in self.buffers.items():
            d[f"buffer.{name}"] = buf.copy()
        return d

    @classmethod
    def from_state_dict(cls, d: Mapping[str, Any], spec: ModelSpec) -> OptState:
        """Inverse of ``state_dict``; checks every buffer against ``spec``."""
        for key in ("optimizer", "step"):
            if key not in d:
                raise ValueError(f"optimizer state: missing field {key!r}")
        opt = d["optimizer"]
        optimizer = opt if isinstance(opt, Optimizer) else Optimizer.from_dict(opt)
        step = int(d["step"])
        if step < 0:
            raise ValueError(f"optimizer state: step must be >= 0, got {step}")
        want = BUFFERS[optimizer.kind]
        have = tuple(k.removeprefix("buffer.") for k in d if k.startswith("buffer."))
        if set(have) != set(want):
            raise ValueError(
                f"optimizer state: {optimizer.kind} needs buffers {list(want)}, got {list(have)}"
            )
        unknown = set(d) - {"optimizer", "step"} - {f"buffer.{k}" for k in want}
        if unknown:
            raise ValueError(f"optimizer state: unknown field(s) {sorted(unknown)}")
        buffers = {}
        for name in want:
            arr = np.asarray(d[f"buffer.{name}"])
            if arr.dtype != np.float32 or arr.shape != (spec.num_params,):
                raise ValueError(
                    f"optimizer state: buffer {name!r} must be float32 of shape "
                    f"({spec.num_params},), got {arr.dtype} {arr.shape}"
                )
            buffers[name] = np.array(arr, copy=True)
        return cls(optimizer, step, buffers)

    def __repr__(self) -> str:
        return f"OptState({self.optimizer.kind}, step={self.step})"


def momentum_step(
    params: np.ndarray,
    grad: np.ndarray,
    velocity: np.ndarray,
    *,
    lr: float,
    momentum: float,
    nesterov: bool,
) -> None:
    """One (Nesterov) momentum step in place, with the very kernel the local
    optimizer runs (``v = mu·v + g``; ``p -= lr·(g + mu·v)`` or ``lr·v``), so the
    coordinator's outer step and a client's inner step are one formula in one home.
    All three arrays are flat float32 of the same length."""
    from nn.kernels import _MOMENTUM, optimizer_update_  # numba: only when stepping

    optimizer_update_(
        params, grad, _MOMENTUM, float(lr), float(momentum), bool(nesterov),
        0.0, 0.0, 0.0, 1, velocity, velocity,
    )  # fmt: skip
