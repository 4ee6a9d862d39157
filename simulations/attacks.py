"""Byzantine players: behaviours a scenario mixes into its crowd (``[clients.attack]``).

A Byzantine player runs the real session over its real link like any other; only
what it computes, or what it uploads, is a lie. Each attack is the textbook one,
sized so that it is not trivially caught by a norm check unless it says so:

- ``sign_flip``: uploads −u instead of its honest update u.
- ``scaled``: uploads ``scale · u`` (default −10: a reversed, amplified step).
- ``noise``: uploads Gaussian noise with ``noise`` times u's RMS per coordinate.
- ``label_flip``: trains honestly on flipped labels (class c → C − 1 − c).
- ``alie``: "a little is enough" (Baruch et al. 2019): from two honest updates on
  different batches it estimates the honest mean μ and spread σ per coordinate and
  uploads μ − z·σ, a shift small enough to hide inside the honest spread.
- ``free_rider``: uploads zeros (claims the work, does none).
- ``stale``: replays the first update it computed, task after task.
- ``hijack``: computes honestly, and also uploads a zero update under the next
  task id (task ids are sequential, so another player's): the coordinator must
  refuse results from a client that holds no lease on the task.

Which players are Byzantine is drawn from the scenario's seed: the first
``round(fraction · count)`` of a seeded permutation of the player indices.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from client.compute import ComputeOutput, run_task
from nn.data import Dataset
from nn.params import Params
from protocol import messages as m
from protocol.shardfile import ShardData

ATTACKS = (
    "sign_flip",
    "scaled",
    "noise",
    "label_flip",
    "alie",
    "free_rider",
    "stale",
    "hijack",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class AttackSpec:
    kind: str
    fraction: float
    scale: float = -10.0
    noise: float = 1.0
    z: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ATTACKS:
            raise ValueError(f"attack.kind: unknown {self.kind!r}; expected one of {ATTACKS}")
        if not 0 <= self.fraction <= 1:
            raise ValueError(f"attack.fraction: must be in [0, 1], got {self.fraction}")

    def byzantine(self, count: int, rng: np.random.Generator) -> frozenset[int]:
        """Indices of the Byzantine players among ``count``."""
        k = round(self.fraction * count)
        return frozenset(int(i) for i in rng.permutation(count)[:k])


def _flipped(data: Dataset | ShardData) -> Dataset | ShardData:
    if isinstance(data, ShardData):
        if data.y.ndim != 1:
            raise ValueError("label_flip: needs class labels")
        return dataclasses.replace(data, y=(data.classes - 1 - data.y).astype(data.y.dtype))
    if data.num_classes is None:
        raise ValueError("label_flip: needs class labels")
    y = (data.num_classes - 1 - data.y_train).astype(data.y_train.dtype)
    return dataclasses.replace(data, y_train=y)


class Attacker:
    """One Byzantine player's compute: honest maths, then the lie."""

    def __init__(self, spec: AttackSpec, rng: np.random.Generator) -> None:
        self.spec = spec
        self.rng = rng
        self._first: np.ndarray | None = None

    @property
    def hijacks(self) -> bool:
        return self.spec.kind == "hijack"

    def compute(self, task: m.Task, params: Params, data: Dataset | ShardData) -> ComputeOutput:
        kind = self.spec.kind
        if kind == "label_flip":
            return run_task(task, params, _flipped(data))
        out = run_task(task, params, data)
        u = out.update
        if kind == "sign_flip":
            lie = -u
        elif kind == "scaled":
            lie = np.float32(self.spec.scale) * u
        elif kind == "noise":
            rms = float(np.sqrt(np.mean(u.astype(np.float64) ** 2)))
            lie = (self.spec.noise * rms * self.rng.standard_normal(u.size)).astype(np.float32)
        elif kind == "alie":
            other = run_task(dataclasses.replace(task, seed=task.seed ^ 1), params, data).update
            mu = (u + other) / 2
            sigma = np.abs(u - other) / 2
            lie = (mu - np.float32(self.spec.z) * sigma).astype(np.float32)
        elif kind == "free_rider":
            lie = np.zeros_like(u)
        elif kind == "stale":
            if self._first is None or self._first.shape != u.shape:
                self._first = u.copy()
            lie = self._first
        else:  # hijack: the honest update goes up; the forged one is the driver's
            lie = u
        return dataclasses.replace(out, update=np.ascontiguousarray(lie, dtype=np.float32))
