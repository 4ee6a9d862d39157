"""``run_scenario``: one scenario point, run by the simulator its mode needs.

The cost model (``run.mode = "cost"``), federated coordinators (a
``[federation]`` section) or the numeric driver; each returns a RunResult. Each
is imported when asked for: the cost model needs neither numba nor a coordinator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simulations.report import RunResult
from simulations.scenario import Scenario


def run_scenario(
    scenario: Scenario,
    *,
    label: str = "",
    point: dict[str, Any] | None = None,
    progress: Callable[[float, float], None] | None = None,
) -> RunResult:
    """Run one scenario point with the driver its mode needs."""
    if scenario.run.mode == "cost":
        from simulations.costmodel import run_cost

        return run_cost(scenario, label=label, point=point, progress=progress)
    if scenario.federation is not None:
        from simulations.federation import run_federation

        return run_federation(scenario, label=label, point=point, progress=progress)
    from simulations.driver import Simulation

    return Simulation(scenario, label=label, point=point, progress=progress).run()
