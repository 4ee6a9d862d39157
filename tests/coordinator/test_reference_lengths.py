"""The norm check's yardstick under tau = "auto" holds short and middle-length
tasks (coordinator/core/reference.py): an update does not grow linearly with its
steps, and per step a slow client's short task read over 10x a 224-step
yardstick on a wide model, so an honest client was refused and closed."""

from __future__ import annotations

from coordinator.core import events as ev
from coordinator.core.assembly import build_core
from coordinator.core.config import parse_job
from protocol import messages as m
from testkit.loopback import Loopback
from tests.coordinator.coord_helpers import digits

WIDE = [64, 2048, 2048, 10]  # 4.3 M parameters: its 10-step tasks read 11.4x a 224-step one


def test_a_slow_honest_client_on_a_wide_model_is_not_refused() -> None:
    job = parse_job({"model": {"widths": WIDE}, "stop": {"max_versions": 6, "patience": 0}})
    assert job.strategy.tau == "auto"
    core = build_core(job, seed=0, dataset=digits())
    lb = Loopback(core)
    lb.add_client("slow", flops=1e8)  # its tasks are tau_min (10) steps
    lb.run(until=1e5)
    tasks = [o.message for o in lb.outputs if isinstance(getattr(o, "message", None), m.Task)]
    assert tasks and {t.steps for t in tasks} == {job.strategy.tau_min}
    assert not [o for o in lb.outputs if isinstance(o, ev.ResultRejected)]
    # the yardstick: tasks of tau_min steps and of the middle of tau's range
    assert len(core.validator.reference) == 2 * job.validation.reference_tasks
    assert core.finished is not None and core.finished.reason == "max_versions"


def test_a_fixed_tau_keeps_one_yardstick() -> None:
    job = parse_job({"model": {"widths": [64, 32, 10]}, "strategy": {"tau": 20}})
    core = build_core(job, seed=0, dataset=digits())
    assert len(core.validator.reference) == job.validation.reference_tasks
