"""The coordinator: a sans-IO core (state machine), its job config, strategies and events."""

from coordinator.config import JobConfig, JobConfigError, load_job, parse_job
from coordinator.core import Coordinator, server_limits
from coordinator.events import (
    Action,
    Checkpoint,
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
    Send,
    TaskDeclined,
    TaskLeased,
)

__all__ = [
    "Action",
    "Checkpoint",
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
    "Send",
    "TaskDeclined",
    "TaskLeased",
    "load_job",
    "parse_job",
    "server_limits",
]
