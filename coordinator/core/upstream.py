"""Federated coordinators: an edge serves its own crowd and syncs with a root.

The root is an ordinary coordinator running a decentral strategy, and an edge joins it as one
of its clients (``coordinator.federation.edge.EdgeUplink``, the IO half: a desktop client whose
"compute" is its crowd). This module is the sans-IO half: the state an edge keeps and the two
operations on its core. A root task says "start from model version v": ``rebase`` makes the
edge's model *become* the task's model; its crowd trains until the edge moved
``every_versions`` versions (or ``every_s`` seconds passed); ``sync`` answers with its
pseudo-gradient through the root's normal result path, and the root's strategy is the outer
optimizer. Progress the root does not have yet is *carried* into the next sync, never added on
top: ``local − snap`` when the root accepted the last sync (taken at model ``snap``), otherwise
everything since the last root model (``local − g``) plus what was carried before. Before the
first sync ``g`` (the *base*) is the job's seeded initial model, which an edge and a root with
the same ``[model]`` share. The base, the carry and the sync in flight are part of the edge
core's checkpoint (:class:`UpstreamState`), so a restarted edge loses nothing its own clients
were told is in. A new model is one model version to the core (``Coordinator.replace_model``),
so its clients' deltas and staleness keep working. Operating it: docs/operations.md ("One
coordinator per game server"); why replace and carry: docs/decisions.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from nn.params import Params

if TYPE_CHECKING:
    from coordinator.core.events import Output
    from coordinator.core.machine import Coordinator

#: ``hello.platform`` of an edge (docs/protocol.md §14), for the root's operators
EDGE_PLATFORM = "crowdgrad-edge"


@dataclass(slots=True)
class UpstreamState:
    """What of the edge's progress the root has, and what it does not.

    ``base`` is the root model the edge's model last became; ``carry`` is
    progress made before that which the root does not have yet. Unsent progress
    is ``(local − base) + carry``; a sync sends it and remembers the model it was
    measured on under the task id (``inflight``). Once the root accepts that
    result, only what came after that model is unsent; a refused or lost upload
    leaves everything unsent, so it goes up again.
    """

    base: np.ndarray | None = None
    carry: np.ndarray | None = None
    root_version: int = -1
    syncs: int = 0
    #: task id -> the edge model that result's progress was measured on
    inflight: dict[str, np.ndarray] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """For /api/status: the root version last taken, syncs sent, in flight."""
        return {
            "root_version": self.root_version,
            "syncs": self.syncs,
            "in_flight": len(self.inflight),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "base": None if self.base is None else self.base.copy(),
            "carry": None if self.carry is None else self.carry.copy(),
            "root_version": self.root_version,
            "syncs": self.syncs,
            "inflight": {k: v.copy() for k, v in self.inflight.items()},
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> UpstreamState:
        def arr(value: Any) -> np.ndarray | None:
            return None if value is None else np.array(value, dtype=np.float32)

        return cls(
            base=arr(state.get("base")),
            carry=arr(state.get("carry")),
            root_version=int(state["root_version"]),
            syncs=int(state["syncs"]),
            inflight={str(k): np.array(v, dtype=np.float32) for k, v in state["inflight"].items()},
        )


def rebase(
    core: Coordinator, root: Params, root_version: int, now: float, accepted: set[str]
) -> tuple[int, list[Output]]:
    """The edge's model becomes the root's; the progress the root does not have
    (given ``accepted``, the task ids of results the root acked as accepted) is
    carried into the next sync.

    Runs on the core's thread (``CoreService.act``); returns the edge's version
    after it (one version more, unless the model was already the root's) and the
    core's outputs.
    """
    up = core.upstream
    if up is None:
        raise RuntimeError("rebase: this coordinator has no upstream")
    spec = core.params.spec
    if tuple(root.spec.widths) != tuple(spec.widths):
        raise ValueError(
            f"the root's model {list(root.spec.widths)} is not this edge's {list(spec.widths)}"
        )
    local = core.params.data
    sent = [t for t in up.inflight if t in accepted]
    if sent:  # ids are issued in order: the newest accepted sync covers the ones before
        unsent = local - up.inflight[sent[-1]]
    else:
        base = up.base if up.base is not None else spec.init_params(core.job.model.init_seed).data
        unsent = local - base
        if up.carry is not None:
            unsent += up.carry
    up.inflight.clear()
    up.carry = unsent.astype(np.float32)
    out: list[Output] = []
    if not np.array_equal(root.data, local):
        out = core.replace_model(root.data, now)
    up.base = root.data.astype(np.float32, copy=True)
    up.root_version = root_version
    return core.version, out


def sync(core: Coordinator, task_id: str) -> np.ndarray:
    """The pseudo-gradient to send for ``task_id``: all progress the root does
    not have (``local − base + carry``); the model it was measured on is kept
    until the root answers."""
    up = core.upstream
    if up is None or up.base is None:
        raise RuntimeError("sync: no root model to measure from")
    snap = core.params.data.astype(np.float32, copy=True)
    up.inflight[task_id] = snap
    up.syncs += 1
    update = snap - up.base
    if up.carry is not None:
        update += up.carry
    return update
