import numpy as np
import pytest

from simulations.distributions import Fixed, LogNormal
from simulations.scenario import (
    ScenarioError,
    expand_sweep,
    load_raw,
    load_scenario,
    parse_scenario,
    resolve,
    shipped,
)


def test_defaults_and_link_from_job_profile():
    s = parse_scenario(
        {
            "job": {"link": {"profile": "roblox", "bytes_per_s": 20_000}},
            "clients": {"count": 3, "latency": {"kind": "fixed", "value": 0.05}},
        }
    )
    assert s.clients.count == 3
    assert s.link.bandwidth_up == 20_000  # the override
    assert s.link.messages_per_s == 30  # from the profile
    assert s.link.latency == Fixed(value=0.05)
    assert s.clients.churn.session is None


def test_every_bad_field_is_listed_once_with_its_path():
    with pytest.raises(ScenarioError) as info:
        parse_scenario(
            {
                "clients": {
                    "count": 0,
                    "compute": {"kind": "gamma"},
                    "churn": {"drop_per_minute": 2},
                },
                "job": {"strategy": {"name": "fastest"}, "bogus": 1},
                "run": {"mode": "quantum"},
                "typo": 1,
            },
            source="bad.toml",
        )
    paths = [p for p, _ in info.value.errors]
    assert paths == sorted(
        [
            "clients.count",
            "clients.compute",
            "clients.churn",
            "job.strategy.name",
            "job.bogus",
            "run.mode",
            "typo",
        ]
    )
    text = str(info.value)
    assert text.startswith("bad.toml: 7 invalid field(s)")
    assert "unknown kind 'gamma'" in text


def test_compute_rate_must_be_positive():
    with pytest.raises(ScenarioError, match=r"clients\.compute"):
        parse_scenario({"clients": {"compute": 0}})


def test_bad_toml_and_missing_file(tmp_path):
    p = tmp_path / "x.toml"
    p.write_text("seed = [", encoding="utf-8")
    with pytest.raises(ScenarioError, match="<toml>"):
        load_scenario(p)
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.toml")


def test_sweep_grid_and_zipped_keys():
    data = {
        "clients": {"count": 2},
        "sweep": {
            "job.model.preset,job.data.dataset": [
                ["tiny", "teacher:tiny"],
                ["small", "teacher:small"],
            ],
            "clients.count": [2, 5, 9],
        },
        "job": {"model": {"preset": "tiny", "loss": "mse"}},
    }
    pts = expand_sweep(data)
    assert len(pts) == 6
    point, sc = pts[-1]
    assert point == {
        "job.model.preset": "small",
        "job.data.dataset": "teacher:small",
        "clients.count": 9,
    }
    assert sc.job.model.preset == "small" and sc.job.data.dataset == "teacher:small"
    assert sc.clients.count == 9


def test_sweep_errors_name_the_point():
    with pytest.raises(ScenarioError, match=r"clients\.count=0"):
        expand_sweep({"sweep": {"clients.count": [1, 0]}})
    with pytest.raises(ScenarioError, match="non-empty lists"):
        expand_sweep({"sweep": {"clients.count": []}})
    with pytest.raises(ScenarioError, match="2 items"):
        expand_sweep({"sweep": {"a.b,c.d": [[1]]}})


@pytest.mark.parametrize("name", shipped())
def test_shipped_scenarios_are_valid(name):
    pts = expand_sweep(load_raw(resolve(name)), source=name)
    assert pts
    for _, sc in pts:
        assert sc.name == name


def test_shipped_names():
    names = shipped()
    for n in ("seed-table-4.4-4.6", "seed-table-4.7", "seed-table-4.8", "digits-time-to-target"):
        assert n in names
    digits = load_scenario("digits-time-to-target")
    assert isinstance(digits.clients.compute, LogNormal)


def test_named_compute_profiles_calibrated_from_the_browser_benchmark():
    from simulations.scenario import COMPUTE_PROFILES

    sc = parse_scenario({"clients": {"compute": "browser"}})
    assert sc.clients.compute is COMPUTE_PROFILES["browser"]
    # WASM SIMD in a worker against plain JS, as measured (benchmarks/browser.py)
    assert COMPUTE_PROFILES["browser"].mean > 5 * COMPUTE_PROFILES["browser-js"].mean
    assert COMPUTE_PROFILES["browser-hidden"].mean < COMPUTE_PROFILES["browser"].mean
    with pytest.raises(ScenarioError, match=r"clients\.compute.*unknown compute profile 'gpu'"):
        parse_scenario({"clients": {"compute": "gpu"}})


def test_a_frame_budget_scales_each_players_rate():
    """clients.frame_budget_ms: players compute inside their game's loop, in all but
    the measured per-frame overhead of their budget."""
    from simulations.scenario import FRAME_OVERHEAD_MS

    plain = parse_scenario({"clients": {"compute": 4e9}})
    assert plain.clients.frame_share == 1.0 and "frame_budget_ms" not in plain.to_dict()["clients"]
    s = parse_scenario({"clients": {"compute": 4e9, "frame_budget_ms": 4, "frame_hz": 50}})
    share = (4 - FRAME_OVERHEAD_MS) * 50 / 1000
    assert s.clients.frame_share == pytest.approx(share)
    assert s.clients.sample_flops(np.random.default_rng(0)) == pytest.approx(4e9 * share)
    assert s.to_dict()["clients"]["frame_share"] == s.clients.frame_share
    tiny = parse_scenario({"clients": {"frame_budget_ms": 0.5}})  # below the overhead
    assert tiny.clients.frame_share == pytest.approx(0.1 * 0.5 * 60 / 1000)
    with pytest.raises(ScenarioError, match="exceeds the frame"):
        parse_scenario({"clients": {"frame_budget_ms": 20}})  # 60 Hz: 16.7 ms a frame
