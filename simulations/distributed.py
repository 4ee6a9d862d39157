"""Sweeps on Ray: every point of a scenario grid as a Ray task.

``crowdgrad simulate SCENARIO --sweep --ray [ADDRESS]`` hands each point to
:func:`run_points_on_ray`. Without an address a local Ray is started for the
run (``num_cpus`` workers, no dashboard) and stopped after; with one
(``ray://host:10001`` or ``auto``) the points run on that cluster, each node
needing crowdgrad installed in the same version.

Byte-identical to the sequential run: a point's numerics depend on how many
threads its BLAS and numba use (a different summation order moves a loss in the
8th digit), and Ray workers start with ``OMP_NUM_THREADS=1`` where the
sequential run would take every core. So both paths pin the same count through
:func:`nn.threads.set_threads` before a point runs (``--threads``, default 1), the
points are run by the same function, and results come back in grid order
whatever order they finish in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from simulations.report import RunResult
from simulations.scenario import Scenario

log = logging.getLogger(__name__)


def run_point(
    scenario: Scenario,
    label: str,
    point: dict[str, Any],
    *,
    threads: int | None = None,
    progress: Callable[[float, float], None] | None = None,
) -> RunResult:
    """One grid point with its thread counts pinned (``threads``, default
    ``$CROWDGRAD_THREADS`` or 1); the sequential path and every Ray task call this."""
    from nn.threads import set_threads
    from simulations.runner import run_scenario

    set_threads(threads)
    return run_scenario(scenario, label=label, point=point, progress=progress)


def run_points_on_ray(
    points: Sequence[tuple[str, dict[str, Any], Scenario]],
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    threads: int | None = None,
    on_done: Callable[[int, RunResult], None] | None = None,
) -> list[RunResult]:
    """Run ``(label, point, scenario)`` triples as Ray tasks; results in input order.

    ``on_done(index, result)`` is called as each finishes (for a progress bar).
    A local Ray (``address`` None) gets ``num_cpus`` CPUs (default: all) and
    is shut down afterwards; a cluster is only disconnected from.
    """
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError(
            "--ray needs Ray: pip install 'crowdgrad[ray]' (or pip install ray)"
        ) from exc
    started = not ray.is_initialized()
    if started:
        kwargs: dict[str, Any] = {
            "include_dashboard": False,
            "log_to_driver": False,
            "logging_level": logging.WARNING,
        }
        if address is None:
            kwargs["num_cpus"] = num_cpus
        else:
            kwargs["address"] = address
        ray.init(**kwargs)
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(run_point)
        refs = [remote.remote(sc, label, point, threads=threads) for label, point, sc in points]
        index = {ref: i for i, ref in enumerate(refs)}
        results: list[RunResult | None] = [None] * len(refs)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                i = index[ref]
                results[i] = ray.get(ref)
                if on_done is not None:
                    on_done(i, results[i])
        return [r for r in results if r is not None]
    finally:
        if started:
            ray.shutdown()
