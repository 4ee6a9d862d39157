"""The coordinator: a sans-IO core (state machine), its job config, strategies and events.

The names below are imported on first use (PEP 562), not with the package: every
``coordinator.x`` import runs this file first, and the core with its numba kernels
is most of a second of CPU that ``crowdgrad coordinator`` wants to spend after it
listens (a client that starts beside it then waits in the accept queue instead of
being refused), and that a light module (the admission limits, the job file) never
needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coordinator.config import JobConfig, JobConfigError, load_job, parse_job
    from coordinator.core import Coordinator, server_limits
    from coordinator.events import (
        Action,
        Checkpoint,
        ClientExcluded,
        ClientJoined,
        ClientLeft,
        Close,
        Evaluated,
        Event,
        JobFinished,
        LeaseExpired,
        ModelUpdated,
        Output,
        ResultAccepted,
        ResultRejected,
        ResultVerified,
        Send,
        TaskDeclined,
        TaskLeased,
    )

#: each public name and the module it comes from
_HOME: dict[str, str] = {
    **dict.fromkeys(("JobConfig", "JobConfigError", "load_job", "parse_job"), "config"),
    **dict.fromkeys(("Coordinator", "server_limits"), "core"),
    **dict.fromkeys(
        (
            "Action",
            "Checkpoint",
            "ClientExcluded",
            "ClientJoined",
            "ClientLeft",
            "Close",
            "Evaluated",
            "Event",
            "JobFinished",
            "LeaseExpired",
            "ModelUpdated",
            "Output",
            "ResultAccepted",
            "ResultRejected",
            "ResultVerified",
            "Send",
            "TaskDeclined",
            "TaskLeased",
        ),
        "events",
    ),
}

__all__ = [
    "Action",
    "Checkpoint",
    "ClientExcluded",
    "ClientJoined",
    "ClientLeft",
    "Close",
    "Coordinator",
    "Evaluated",
    "Event",
    "JobConfig",
    "JobConfigError",
    "JobFinished",
    "LeaseExpired",
    "ModelUpdated",
    "Output",
    "ResultAccepted",
    "ResultRejected",
    "ResultVerified",
    "Send",
    "TaskDeclined",
    "TaskLeased",
    "load_job",
    "parse_job",
    "server_limits",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:  # a submodule not imported yet: the import system loads it
        raise AttributeError(f"module 'coordinator' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"coordinator.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})
