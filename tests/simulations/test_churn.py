import math

import numpy as np
import pytest

from simulations.churn import ChurnModel, Lifecycle
from simulations.distributions import Exponential, Fixed
from simulations.engine import Engine


@pytest.mark.parametrize("fraction", [0.1, 0.3])
def test_per_minute_rate_drops_that_fraction_within_a_minute(fraction):
    model = ChurnModel.per_minute(fraction)
    rng = np.random.default_rng(11)
    n = 20_000
    sessions = np.array([model.session.sample(rng) for _ in range(n)])
    observed = float((sessions < 60.0).mean())
    # binomial standard error is ~0.003 at n=20k; allow 4 sigma
    assert abs(observed - fraction) < 4 * math.sqrt(fraction * (1 - fraction) / n)
    assert model.drop_per_minute == pytest.approx(fraction)


def test_zero_rate_means_no_drops():
    model = ChurnModel.per_minute(0.0)
    assert model.session is None
    assert model.drop_per_minute == 0.0


def test_from_table_variants_and_errors():
    m = ChurnModel.from_table({"session": {"kind": "fixed", "value": 5}, "rejoin": 2})
    assert m.session == Fixed(value=5.0) and m.rejoin == Fixed(value=2.0)
    m = ChurnModel.from_table({"drop_per_minute": 0.1})
    assert isinstance(m.session, Exponential) and m.rejoin is not None
    with pytest.raises(ValueError, match=r"churn\.drop_per_minute: must be in \[0, 1\)"):
        ChurnModel.from_table({"drop_per_minute": 1.5})
    with pytest.raises(ValueError, match="not both"):
        ChurnModel.from_table({"drop_per_minute": 0.1, "session": 3})
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['sesion'\]"):
        ChurnModel.from_table({"sesion": 3})
    with pytest.raises(ValueError, match=r"churn\.session"):
        ChurnModel.from_table({"session": {"kind": "nope"}})


def test_lifecycle_alternates_leave_and_join_at_sampled_times():
    eng = Engine(seed=0)
    log = []
    model = ChurnModel(session=Fixed(value=10.0), rejoin=Fixed(value=3.0))
    lc = Lifecycle(
        eng,
        model,
        name="c0",
        on_leave=lambda: log.append(("leave", eng.now)),
        on_join=lambda: log.append(("join", eng.now)),
    )
    lc.start()
    eng.run_until(30.0)
    assert log == [("leave", 10.0), ("join", 13.0), ("leave", 23.0), ("join", 26.0)]
    assert lc.drops == 2 and lc.sessions == 3
    lc.stop()
    eng.run_until(100.0)
    assert len(log) == 4


def test_lifecycle_without_rejoin_leaves_once():
    eng = Engine(seed=0)
    log = []
    lc = Lifecycle(
        eng,
        ChurnModel(session=Fixed(value=1.0)),
        name="c",
        on_leave=lambda: log.append("leave"),
        on_join=lambda: log.append("join"),
    )
    lc.start()
    eng.run_until()
    assert log == ["leave"]
