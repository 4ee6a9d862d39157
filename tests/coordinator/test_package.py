"""The ``coordinator`` package imports its re-exported names on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_a_light_module_does_not_import_the_core() -> None:
    code = (
        "import sys, coordinator.http.admission, coordinator.http.listen;"
        "print(sorted(m for m in ('coordinator.core.machine', 'numba') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_exported_name_resolves_to_its_module() -> None:
    import coordinator
    from coordinator import Coordinator, TaskLeased, parse_job
    from coordinator.core.config import parse_job as config_parse_job
    from coordinator.core.events import TaskLeased as EventTaskLeased
    from coordinator.core.machine import Coordinator as CoreCoordinator

    assert Coordinator is CoreCoordinator and TaskLeased is EventTaskLeased
    assert parse_job is config_parse_job
    for name in coordinator.__all__:
        assert getattr(coordinator, name) is not None
    assert set(coordinator.__all__) <= set(dir(coordinator))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        coordinator.nothing  # noqa: B018
