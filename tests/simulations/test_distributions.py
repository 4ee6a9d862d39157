import math

import numpy as np
import pytest

from simulations.distributions import (
    DistributionError,
    Empirical,
    Fixed,
    LogNormal,
    parse,
)

TABLES = [
    5,
    {"kind": "fixed", "value": 2.5},
    {"kind": "uniform", "low": 1, "high": 3},
    {"kind": "normal", "mean": 10, "std": 2},
    {"kind": "lognormal", "median": 2e9, "sigma": 0.5},
    {"kind": "exponential", "mean": 60},
    {"kind": "empirical", "values": [1, 2, 4], "weights": [1, 1, 2]},
]


@pytest.mark.parametrize("table", TABLES)
def test_sample_mean_matches_declared_mean(table):
    d = parse(table)
    rng = np.random.default_rng(1)
    xs = np.array([d.sample(rng) for _ in range(20_000)])
    assert (xs >= 0).all()
    assert xs.mean() == pytest.approx(d.mean, rel=0.03)
    assert parse(d.to_dict()) == d


@pytest.mark.parametrize("table", TABLES)
def test_same_seed_same_draws(table):
    d = parse(table)
    a = [d.sample(np.random.default_rng(3)) for _ in range(3)]
    b = [d.sample(np.random.default_rng(3)) for _ in range(3)]
    assert a == b


def test_bare_number_is_fixed_and_lognormal_mean():
    assert parse(3) == Fixed(value=3.0)
    d = parse({"kind": "lognormal", "median": 1.0, "sigma": 1.0})
    assert isinstance(d, LogNormal)
    assert d.mean == pytest.approx(math.exp(0.5))


def test_empirical_weights_are_normalised():
    d = parse({"kind": "empirical", "values": [1, 3]})
    assert isinstance(d, Empirical)
    assert d.weights == (0.5, 0.5)
    assert d.mean == 2.0


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("fast", "expected a number or a table"),
        ({"value": 1}, "kind: unknown kind None"),
        ({"kind": "gamma"}, "unknown kind 'gamma'"),
        ({"kind": "lognormal", "median": 1}, r"missing \['sigma'\]"),
        ({"kind": "fixed", "value": 1, "vlaue": 2}, r"unknown \['vlaue'\]"),
        ({"kind": "uniform", "low": 3, "high": 1}, "must be >= low"),
        ({"kind": "exponential", "mean": 0}, "must be > 0"),
        ({"kind": "fixed", "value": -1}, "must be >= 0"),
        ({"kind": "fixed", "value": True}, "expected a finite number"),
        ({"kind": "fixed", "value": float("nan")}, "expected a finite number"),
        ({"kind": "empirical", "values": []}, "non-empty list"),
        ({"kind": "empirical", "values": [1], "weights": [1, 2]}, "one per value"),
        ({"kind": "empirical", "values": [1], "weights": [0]}, "not all be zero"),
    ],
)
def test_bad_tables_name_the_field(table, message):
    with pytest.raises(DistributionError, match=message) as info:
        parse(table, "clients.latency")
    assert "clients.latency" in str(info.value)
