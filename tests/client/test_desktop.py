"""Desktop client pieces that need no socket: argument checks, sliced compute, FLOP/s."""

from __future__ import annotations

import numpy as np
import pytest

from client import flops as fl
from client.compute import run_task
from client.desktop import DesktopClient
from client.flops import cached_flops, measure_flops
from client.session import ComputeRequest
from nn.spec import ModelSpec
from protocol import messages as m


def _task(steps: int = 12) -> m.Task:
    spec = ModelSpec(widths=(64, 16, 10))
    return m.Task(
        task_id="1",
        kind="train",
        model_version=0,
        spec=spec,
        dataset="digits#0",
        indices=np.arange(0, 400, dtype=np.int32),
        steps=steps,
        batch=8,
        seed=5,
        num_chunks=1,
        model_transfer="m0",
    )


@pytest.mark.parametrize(
    ("kw", "what"),
    [
        ({"cpu_share": 0.0}, "cpu_share"),
        ({"cpu_share": 1.5}, "cpu_share"),
        ({"backoff_base": 0.0}, "backoff"),
        ({"priority": "realtime"}, "priority"),
    ],
)
def test_bad_arguments_are_named(kw: dict, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        DesktopClient("ws://127.0.0.1:1/ws", **kw)


def test_sliced_compute_matches_the_whole_task() -> None:
    """A duty-cycled client computes the same update as a full-speed one."""
    task = _task()
    base = task.spec.init_params(0)
    whole = run_task(task, base)
    client = DesktopClient("ws://127.0.0.1:1/ws", cpu_share=0.5, flops=1.0, slice_s=1e-9)

    class _Session:
        computing = 1

    client.session = _Session()  # type: ignore[assignment]
    sliced = client._compute(ComputeRequest(request_id=1, task=task, params=base))
    assert sliced is not None and sliced.steps == task.steps
    np.testing.assert_array_equal(sliced.update, whole.update)


def test_sliced_compute_stops_when_superseded() -> None:
    task = _task(steps=50)
    client = DesktopClient("ws://127.0.0.1:1/ws", cpu_share=0.5, flops=1.0, slice_s=1e-9)

    class _Session:
        computing = 2  # another request superseded request 1

    client.session = _Session()  # type: ignore[assignment]
    req = ComputeRequest(request_id=1, task=task, params=task.spec.init_params(0))
    assert client._compute(req) is None


def test_measure_flops_is_positive_and_rejects_a_bad_budget() -> None:
    assert measure_flops(budget_s=0.02) > 1e6
    with pytest.raises(ValueError, match="budget_s"):
        measure_flops(budget_s=0)


def test_the_flops_measurement_is_kept_for_this_machine_for_a_day(tmp_path, monkeypatch) -> None:
    path, calls = tmp_path / "cache" / "flops.json", []

    def measure() -> float:
        calls.append(1)
        return 1e9 * len(calls)

    assert cached_flops(path, measure=measure) == (1e9, False)  # none yet: measured, kept
    assert cached_flops(path, measure=measure) == (1e9, True)
    assert cached_flops(path, max_age_s=-1, measure=measure) == (2e9, False)  # too old
    monkeypatch.setattr(fl, "probe_key", lambda: "another machine")
    assert cached_flops(path, measure=measure) == (3e9, False)  # not this machine's
    path.write_text("{not json")
    assert cached_flops(path, measure=measure) == (4e9, False)  # damaged: measured again
    assert cached_flops(path, measure=measure) == (4e9, True)
    # a file that cannot be written costs the measurement only
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert cached_flops(blocked / "flops.json", measure=measure) == (5e9, False)
    assert len(calls) == 5
    # the client keeps it beside its shards, and not at all with --no-cache
    assert DesktopClient("ws://x/ws", cache_dir=tmp_path).flops_file == tmp_path / "flops.json"
    assert DesktopClient("ws://x/ws", cache=False).flops_file is None


def test_seeded_init_flag_reaches_hello() -> None:
    import argparse

    from crowdgrad.commands.client import add_arguments, client_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert client_from_args(p.parse_args(["ws://x/ws"])).seeded_init is True
    assert client_from_args(p.parse_args(["ws://x/ws", "--no-seeded-init"])).seeded_init is False


def test_prefetch_flag_reaches_the_session() -> None:
    import argparse

    from crowdgrad.commands.client import add_arguments, client_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert client_from_args(p.parse_args(["ws://x/ws"])).prefetch is True
    assert client_from_args(p.parse_args(["ws://x/ws", "--no-prefetch"])).prefetch is False


def test_priority_flag_defaults_to_idle_and_reaches_the_compute_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import argparse
    import os
    import sys

    from client import priority
    from client.priority import Priority
    from crowdgrad.commands.client import add_arguments, client_from_args

    pools: list[bool] = []
    monkeypatch.setattr(priority, "lower_native_pools", lambda: pools.append(True) or [])

    p = argparse.ArgumentParser()
    add_arguments(p)
    idle = client_from_args(p.parse_args(["ws://x/ws"]))
    assert idle.priority is Priority.IDLE and idle.lower_pools
    normal = client_from_args(p.parse_args(["ws://x/ws", "--priority", "normal"]))
    assert normal.priority is Priority.NORMAL
    if sys.platform.startswith("linux"):
        policy = idle._pool.submit(os.sched_getscheduler, 0).result()
        assert policy in (os.SCHED_IDLE, os.sched_getscheduler(0))  # SCHED_IDLE or nice 19
        assert normal._pool.submit(os.sched_getscheduler, 0).result() == os.sched_getscheduler(0)
    for c in (idle, normal):
        c._pool.shutdown()
    assert pools == ([True] if sys.platform.startswith("linux") else [])  # the CLI owns its process


def test_the_compute_thread_keeps_the_processes_thread_count() -> None:
    """numba counts threads per thread: a fresh one would use every core."""
    import numba

    client = DesktopClient("ws://127.0.0.1:1/ws", priority="normal")
    try:
        assert client._pool.submit(numba.get_num_threads).result() == numba.get_num_threads()
    finally:
        client._pool.shutdown()
