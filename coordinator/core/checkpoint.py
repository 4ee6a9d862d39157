"""A core's state as a checkpoint, and a core rebuilt from one.

``state_of`` holds everything acknowledged work needs to survive a crash (the
model, the strategy's state, the tasks accepted, replication's holdings); a core
``restore``d from it answers a result resent for an old task as ``duplicate`` or
``stale``, never as new work; ``replay`` applies logged sub-model merges again,
bit for bit (docs/operations.md, "Checkpoints").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from coordinator.core.earlystop import ending
from coordinator.core.upstream import UpstreamState
from nn.params import Params
from nn.spec import ModelSpec
from nn.subnet import Subnet

if TYPE_CHECKING:
    from coordinator.core.machine import Coordinator

#: Task ids skipped on a restore: more than a coordinator issues between two
#: checkpoints (docs/coordinator.md, "Tasks and leases").
RESTORE_TASK_ID_GAP = 1 << 20


def state_of(core: Coordinator, *, params: bool = True) -> dict[str, Any]:
    """``params=False`` leaves the model out, for a caller that copies only what
    changed (an incremental checkpoint)."""
    state = {
        "version": core.model.version,
        "contributions": core.model.contributions,
        "progress": core.model.progress,
        "strategy": core.strategy.state_dict(),
        "accepted_tasks": core.book.accepted_ids(),
        "accepted_ages": core.book.accepted_ages(core.now),
        "accepted_results": core.accepted_results,
        "next_task_id": core.book.next_task_id,
        "norms": list(core.validator.norms),
    }
    if core.verifier.enabled:
        state["replication"] = core.verifier.state_dict()
    if core.upstream is not None:
        state["upstream"] = core.upstream.state_dict()
    if core.submodels is not None:
        state["submodel"] = core.submodels.state_dict()
    if core.credit.accounts:
        state["credit"] = core.credit.state_dict()
    if core.finished is not None:
        state["finished"] = ending(core.job.stop, core.finished)
    if params:
        state["params"] = core.model.params.data.copy()
    return state


def load_state(core: Coordinator, state: dict[str, Any]) -> None:
    """Put ``state`` into a core just built for the same job (its model in place)."""
    core.model.version = int(state["version"])
    core.model.contributions = int(state["contributions"])
    # (a checkpoint of before the progress clock: its versions, as that clock was)
    core.model.progress = float(state.get("progress", core.model.version))
    core.strategy.load_state_dict(state["strategy"])
    ages = state.get("accepted_ages")  # (a checkpoint of before ages were kept: none)
    core.book.remember_accepted(
        [int(t) for t in state["accepted_tasks"]],
        None if ages is None else [float(a) for a in ages],
    )
    core.results.accepted = int(state["accepted_results"])
    # Ids issued after this checkpoint and before the crash are in clients'
    # hands; skip them, so a result resent for one of them is answered stale
    # instead of matching a new task of another version (a counted rejection
    # that closed honest clients after a few crashes).
    core.book.next_task_id = int(state["next_task_id"]) + RESTORE_TASK_ID_GAP
    core.validator.norms.extend(float(x) for x in state["norms"])
    if "replication" in state:
        core.verifier.load_state_dict(state["replication"])
    if "upstream" in state:
        core.upstream = UpstreamState.from_state(state["upstream"])
    if core.submodels is not None and "submodel" in state:
        core.submodels.load_state_dict(state["submodel"])
    if "credit" in state:
        core.credit.load_state_dict(state["credit"])
    core.ended = state.get("finished")  # (a checkpoint of before endings were kept: none)


def params_of(spec: ModelSpec, state: dict[str, Any]) -> Params:
    """The model a checkpoint holds, as ``Params`` of the job's spec."""
    return Params.from_flat(spec, np.asarray(state["params"], dtype=np.float32))


def replay(
    core: Coordinator,
    merges: Iterable[tuple[int, int, Subnet, np.ndarray, float]],
    *,
    rows_as_of: list[np.ndarray] | None = None,
) -> int:
    """Apply logged merges ``(task_id, version, subnet, update, scale)`` again,
    in order, after a restore: the same arithmetic, so the same model bit for
    bit. Stops at the first that does not make the next version (a step the
    log does not hold came between); returns how many were applied.

    ``rows_as_of``: per layer, the version each row of the restored model is
    at (a checkpoint taken while the model trained copies each neuron group as
    of its own version); a merge lands only on rows older than it."""
    model, book = core.model, core.book
    n = 0
    for task_id, version, subnet, update, scale in merges:
        if version != model.version + 1:
            break
        rows = None
        if rows_as_of is not None:
            rows = [r < version for r in rows_as_of]
            if all(m.all() for m in rows):
                rows_as_of, rows = None, None  # every row is older from here on
        subnet.add_to(model.params, update, scale, rows=rows)
        model.changed.mark(subnet)
        model.version = version
        model.progress += 1.0  # (the log keeps no task's share: a whole round's)
        model.contributions += 1
        book.remember_accepted([task_id])
        core.results.accepted += 1
        book.next_task_id = max(book.next_task_id, task_id + 1 + RESTORE_TASK_ID_GAP)
        n += 1
    return n
