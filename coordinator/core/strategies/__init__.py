"""The four scheduling methods behind one small interface."""

from coordinator.core.strategies.base import (
    ClientView,
    ModelState,
    Outcome,
    ShardCursor,
    StepReport,
    Strategy,
)
from coordinator.core.strategies.factory import (
    STRATEGIES,
    averaged_in_rounds,
    in_rounds,
    make_strategy,
    serves_prefetch,
)

__all__ = [
    "STRATEGIES",
    "ClientView",
    "ModelState",
    "Outcome",
    "ShardCursor",
    "StepReport",
    "Strategy",
    "averaged_in_rounds",
    "in_rounds",
    "make_strategy",
    "serves_prefetch",
]
