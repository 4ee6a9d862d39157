"""Sub-model tasks: which subnet each task trains, sized to its client.

A job with ``[submodel]`` leases every train task over a subnet (nn/subnet.py): the client
downloads only that slice of the model, trains it as an ordinary, narrower MLP and uploads the
slice's delta; the result path places it back (``Subnet.expand``) and the strategy merges it
(async: as it is; a sync round or a FedBuff buffer: per coordinate over the results that hold
it, ``covered_mean``).

Which neurons (``submodel.mode``): ``random`` draws each hidden layer's neurons afresh per task;
``ist`` hands out each layer's neurons in a random order, block by block, a fresh order when one
runs out or a sync round starts, so consecutive tasks (a round's) train disjoint subnets;
``nested`` takes each layer's first neurons, so a smaller client's subnet is a part of a larger
one's. How many: at most ``fraction`` of each hidden layer, less for a client whose slice would
exceed ``budget_bytes`` or whose task (slice down, compute, delta up) would take longer than
``max_task_s`` at its link rate and measured speed. With ``group`` > 1 the modes pick whole
groups of consecutive neurons (rounded down to fit). Where each mode comes from, and what it
measured: docs/coordinator.md ("Sub-model tasks"); docs/decisions.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compression import get as get_codec
from coordinator.core.config import SubmodelSection
from nn.spec import ModelSpec
from nn.subnet import Subnet, hidden_widths, sub_spec, sub_widths

#: each try at a smaller subnet keeps this share of the last one
SHRINK = 0.85


def encoded_bytes(spec: ModelSpec, codec: str) -> int:
    """Payload bytes of a whole ``spec`` model in ``codec`` (frame overhead aside)."""
    c = get_codec(codec)
    return sum(c.encoded_size((o, i)) + c.encoded_size((o,)) for o, i in spec.layer_shapes)


class SubmodelPlanner:
    """Chooses each task's subnet; IO-free and seeded (its rng is the core's)."""

    def __init__(
        self,
        config: SubmodelSection,
        spec: ModelSpec,
        *,
        model_codec: str,
        update_codec: str,
        rng: np.random.Generator,
    ) -> None:
        self.config = config
        self.spec = spec
        self.rng = rng
        self._down = model_codec
        self._up = update_codec
        # ist: per hidden layer, the current order and how far it has been handed out
        self._orders: list[np.ndarray] = []
        self._next: list[int] = []
        self._round: int | None = None

    # -- sizing -----------------------------------------------------------------------

    def kept(
        self, *, bytes_per_s: float | None, flops_per_s: float | None, samples: int
    ) -> tuple[int, ...]:
        """Each hidden layer's kept count for a client: the largest subnet, up to
        ``fraction``, within the byte budget and ``max_task_s``."""
        c = self.config
        f = c.fraction
        while True:
            kept = sub_widths(self.spec, f)
            if all(k == 1 for k in kept) or self._fits(kept, bytes_per_s, flops_per_s, samples):
                return kept
            f *= SHRINK

    def _fits(
        self,
        kept: Sequence[int],
        bytes_per_s: float | None,
        flops_per_s: float | None,
        samples: int,
    ) -> bool:
        c = self.config
        sub = sub_spec(self.spec, kept)
        down = encoded_bytes(sub, self._down)
        if c.budget_bytes is not None and down > c.budget_bytes:
            return False
        if c.max_task_s is None:
            return True
        seconds = 0.0
        if bytes_per_s:
            seconds += (down + encoded_bytes(sub, self._up)) / bytes_per_s
        if flops_per_s:
            seconds += sub.flops_per_sample(train=True) * samples / flops_per_s
        return seconds <= c.max_task_s

    # -- choosing neurons ---------------------------------------------------------------

    def choose(
        self,
        *,
        bytes_per_s: float | None,
        flops_per_s: float | None,
        samples: int,
        round: int | None = None,
    ) -> Subnet:
        """The subnet of a new task (``round``: its sync round, which restarts the
        IST partition so one round's tasks are disjoint)."""
        kept = self.kept(bytes_per_s=bytes_per_s, flops_per_s=flops_per_s, samples=samples)
        g = self.config.group
        widths = hidden_widths(self.spec)
        units = [-(-n // g) for n in widths]  # groups per layer (the last may be short)
        take = [max(1, k // g) for k in kept]  # whole groups, within the budget
        mode = self.config.mode
        if mode == "nested":
            picked = [np.arange(k) for k in take]
        elif mode == "random":
            picked = [
                np.sort(self.rng.choice(u, size=k, replace=False))
                for u, k in zip(units, take, strict=True)
            ]
        else:
            picked = self._ist(units, take, round)
        keep = [_neurons(p, g, n) for p, n in zip(picked, widths, strict=True)]
        return Subnet(self.spec, tuple(keep), self.config.rescale_exponent)

    def _ist(
        self, widths: Sequence[int], kept: Sequence[int], round: int | None
    ) -> list[np.ndarray]:
        if not self._orders or (round is not None and round != self._round):
            self._orders = [self.rng.permutation(n) for n in widths]
            self._next = [0] * len(widths)
            self._round = round
        keep = []
        for li, (n, k) in enumerate(zip(widths, kept, strict=True)):
            start = self._next[li]
            if start + k > n:  # this order is used up: a fresh one
                self._orders[li] = self.rng.permutation(n)
                start = 0
            self._next[li] = start + k
            keep.append(np.sort(self._orders[li][start : start + k]))
        return keep

    def state_dict(self) -> dict:
        """The generator and the IST orders: a restored job goes on where it was."""
        return {
            "rng": self.rng.bit_generator.state,
            "orders": [o.tolist() for o in self._orders],
            "next": list(self._next),
            "round": self._round,
        }

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self._orders = [np.asarray(o, dtype=np.int64) for o in state["orders"]]
        self._next = [int(x) for x in state["next"]]
        self._round = state["round"]


def _neurons(groups: np.ndarray, g: int, n: int) -> np.ndarray:
    """The neurons of sorted ``groups`` of ``g`` consecutive neurons (of ``n``)."""
    if g == 1:
        return groups
    idx = (groups[:, None] * g + np.arange(g)).reshape(-1)
    return idx[idx < n]
