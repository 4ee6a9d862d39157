"""The coordinator, in four rooms by what they may touch.

- ``coordinator.core``: the sans-IO state machine: bytes and ticks in, actions out;
  no sockets, threads, clock or files beyond the job's own (checked by import-linter).
- ``coordinator.runtime``: the thread that drives the core, its ack gate, journal
  and checkpoints (threads and files).
- ``coordinator.http``: the server face: websockets, routes, admission, dashboard,
  metrics (asyncio, uvicorn, FastAPI).
- ``coordinator.federation``: an edge coordinator's link to its upstream.

The names below are imported on first use (PEP 562): a light module (admission
limits, the job file) must not pay for the core's numba kernels at start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coordinator.core.assembly import build_core, restore_core
    from coordinator.core.config import JobConfig, JobConfigError, load_job, parse_job
    from coordinator.core.events import (
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
    from coordinator.core.handshake import server_limits
    from coordinator.core.machine import Coordinator

#: each public name and the module it comes from
_HOME: dict[str, str] = {
    **dict.fromkeys(("JobConfig", "JobConfigError", "load_job", "parse_job"), "core.config"),
    "Coordinator": "core.machine",
    **dict.fromkeys(("build_core", "restore_core"), "core.assembly"),
    "server_limits": "core.handshake",
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
        "core.events",
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
    "build_core",
    "load_job",
    "parse_job",
    "restore_core",
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
