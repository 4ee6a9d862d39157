"""Random quantities of a scenario: latencies, compute rates, session lengths.

A scenario writes each as a TOML table, ``{kind = "lognormal", median = 2e9,
sigma = 0.5}``, or as a bare number meaning ``fixed``. :func:`parse` turns one
into a small frozen object with ``sample(rng)`` and ``mean``; a bad table raises
:class:`DistributionError` naming the field and what was expected, so a
scenario loader can collect every mistake at once.

Draws always come from a generator the caller passes in (an engine stream), so
the same seed gives the same values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


class DistributionError(ValueError):
    """A distribution table is malformed; the message names the bad field."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Distribution:
    """Base: ``sample`` draws one value, ``mean`` is its expectation."""

    def sample(self, rng: np.random.Generator) -> float:
        raise NotImplementedError

    @property
    def mean(self) -> float:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True, slots=True, kw_only=True)
class Fixed(Distribution):
    value: float

    def sample(self, rng: np.random.Generator) -> float:
        return self.value

    @property
    def mean(self) -> float:
        return self.value

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "fixed", "value": self.value}


@dataclass(frozen=True, slots=True, kw_only=True)
class Uniform(Distribution):
    low: float
    high: float

    def sample(self, rng: np.random.Generator) -> float:
        # numpy's own formula (low + range · next double), bitwise the same as
        # rng.uniform(low, high) at a third of the cost: one draw per frame sent
        return self.low + (self.high - self.low) * rng.random()

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "uniform", "low": self.low, "high": self.high}


@dataclass(frozen=True, slots=True, kw_only=True)
class Normal(Distribution):
    """Normal, clipped below at ``min`` (default 0: times and rates are not negative)."""

    mean_: float
    std: float
    min: float = 0.0

    def sample(self, rng: np.random.Generator) -> float:
        return max(self.min, float(rng.normal(self.mean_, self.std)))

    @property
    def mean(self) -> float:
        return self.mean_

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "normal", "mean": self.mean_, "std": self.std, "min": self.min}


@dataclass(frozen=True, slots=True, kw_only=True)
class LogNormal(Distribution):
    """Parametrised by its median (easier to read off a measurement than mu)."""

    median: float
    sigma: float

    def sample(self, rng: np.random.Generator) -> float:
        return float(self.median * math.exp(self.sigma * rng.standard_normal()))

    @property
    def mean(self) -> float:
        return self.median * math.exp(self.sigma**2 / 2)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "lognormal", "median": self.median, "sigma": self.sigma}


@dataclass(frozen=True, slots=True, kw_only=True)
class Exponential(Distribution):
    mean_: float

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.exponential(self.mean_))

    @property
    def mean(self) -> float:
        return self.mean_

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "exponential", "mean": self.mean_}


@dataclass(frozen=True, slots=True, kw_only=True)
class Empirical(Distribution):
    """One of ``values``, with optional ``weights`` (normalised here)."""

    values: tuple[float, ...]
    weights: tuple[float, ...]

    def sample(self, rng: np.random.Generator) -> float:
        i = int(rng.choice(len(self.values), p=self.weights))
        return self.values[i]

    @property
    def mean(self) -> float:
        return float(sum(v * w for v, w in zip(self.values, self.weights, strict=True)))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "empirical", "values": list(self.values), "weights": list(self.weights)}


#: kind -> (required fields, optional fields)
_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "fixed": (("value",), ()),
    "uniform": (("low", "high"), ()),
    "normal": (("mean", "std"), ("min",)),
    "lognormal": (("median", "sigma"), ()),
    "exponential": (("mean",), ()),
    "empirical": (("values",), ("weights",)),
}
KINDS = tuple(_FIELDS)


def _number(table: Mapping[str, Any], key: str, where: str, *, positive: bool = False) -> float:
    v = table[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise DistributionError(f"{where}.{key}: expected a finite number, got {v!r}")
    if positive and v <= 0:
        raise DistributionError(f"{where}.{key}: must be > 0, got {v!r}")
    if v < 0:
        raise DistributionError(f"{where}.{key}: must be >= 0, got {v!r}")
    return float(v)


def parse(spec: Any, where: str = "distribution") -> Distribution:
    """A TOML value (number or table) → Distribution; ``where`` prefixes errors.

    Values are non-negative: every quantity simulated is a time, a rate or a size.
    """
    if isinstance(spec, Distribution):
        return spec
    if isinstance(spec, int | float) and not isinstance(spec, bool):
        return Fixed(value=_number({"value": spec}, "value", where))
    if not isinstance(spec, Mapping):
        raise DistributionError(
            f"{where}: expected a number or a table with 'kind', got {type(spec).__name__}"
        )
    kind = spec.get("kind")
    if kind not in _FIELDS:
        raise DistributionError(f"{where}.kind: unknown kind {kind!r}; expected one of {KINDS}")
    required, optional = _FIELDS[kind]
    missing = [k for k in required if k not in spec]
    extra = sorted(set(spec) - {"kind", *required, *optional})
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if extra:
            parts.append(f"unknown {extra}")
        raise DistributionError(f"{where} ({kind}): {', '.join(parts)}")
    match kind:
        case "fixed":
            return Fixed(value=_number(spec, "value", where))
        case "uniform":
            low, high = _number(spec, "low", where), _number(spec, "high", where)
            if high < low:
                raise DistributionError(f"{where}: high ({high}) must be >= low ({low})")
            return Uniform(low=low, high=high)
        case "normal":
            mn = _number(spec, "min", where) if "min" in spec else 0.0
            return Normal(
                mean_=_number(spec, "mean", where), std=_number(spec, "std", where), min=mn
            )
        case "lognormal":
            return LogNormal(
                median=_number(spec, "median", where, positive=True),
                sigma=_number(spec, "sigma", where),
            )
        case "exponential":
            return Exponential(mean_=_number(spec, "mean", where, positive=True))
        case "empirical":
            return _empirical(spec, where)
    raise AssertionError(kind)  # pragma: no cover - _FIELDS covers every kind


def _empirical(spec: Mapping[str, Any], where: str) -> Empirical:
    values = spec["values"]
    if not isinstance(values, list) or not values:
        raise DistributionError(f"{where}.values: expected a non-empty list of numbers")
    vals = tuple(_number({"v": v}, "v", f"{where}.values[{i}]") for i, v in enumerate(values))
    weights = spec.get("weights", [1.0] * len(vals))
    if not isinstance(weights, list) or len(weights) != len(vals):
        raise DistributionError(f"{where}.weights: expected {len(vals)} numbers, one per value")
    ws = [_number({"w": w}, "w", f"{where}.weights[{i}]") for i, w in enumerate(weights)]
    total = sum(ws)
    if total <= 0:
        raise DistributionError(f"{where}.weights: must not all be zero")
    return Empirical(values=vals, weights=tuple(w / total for w in ws))
