"""Sub-model tasks in the simulator: the same core and client sessions over
simulated roblox links (the ``submodel-smoke`` scenario)."""

from __future__ import annotations

from simulations.driver import Simulation
from simulations.scenario import load_raw, parse_scenario, resolve


def run(submodel: bool, *, warm: bool = False) -> dict:
    data = load_raw(resolve("submodel-smoke"))
    if not submodel:  # whole-model tasks in the same codec as the slices (fp32)
        data["job"].pop("submodel")
        data["job"].setdefault("codecs", {})["slow_link"] = "off"
    if warm:
        data["clients"]["warm_data"] = True
    sim = Simulation(parse_scenario(data, source="submodel-smoke"))
    return sim.run().summary


def test_players_reach_the_target_through_subnets_moving_fewer_bytes() -> None:
    """Model traffic only: the players hold their shards already (a run that
    reaches its target in a few dozen results would otherwise count mostly the
    shards' first download, the same for both)."""
    sub, whole = run(True, warm=True), run(False, warm=True)
    assert sub["reason"] == whole["reason"] == "target_accuracy"
    per_result = lambda s: (s["bytes_up"] + s["bytes_down"]) / s["results_accepted"]  # noqa: E731
    # a quarter of the hidden neurons: about a quarter of the bytes per task
    assert per_result(sub) < 0.35 * per_result(whole)


def test_the_same_seed_gives_the_same_run() -> None:
    a, b = run(True), run(True)
    assert a == b


def test_a_mapped_model_trains_as_an_allocated_one(monkeypatch) -> None:
    """Above MAP_ABOVE_PARAMS the simulator maps the parameters from a file
    (nn/mapped.py) and the core trains them in place: the same run, bit for bit."""
    import numpy as np

    from simulations import driver

    data = load_raw(resolve("submodel-smoke"))
    plain = Simulation(parse_scenario(data, source="submodel-smoke"))
    a = plain.run().summary
    monkeypatch.setattr(driver, "MAP_ABOVE_PARAMS", 0)
    mapped = Simulation(parse_scenario(data, source="submodel-smoke"))
    assert isinstance(mapped.core.model.params.data, np.memmap)
    b = mapped.run().summary
    assert a == b
    assert mapped.core.model.params.array_equal(plain.core.model.params)
