"""Strategy by name: the one place that knows every scheduling method."""

from __future__ import annotations

import numpy as np

from coordinator.core.config import DataSection, JobConfig, StrategySection
from coordinator.core.layersplit import Boundaries, SplitBlocks
from coordinator.core.strategies.base import ModelState, Strategy
from coordinator.core.strategies.central_async import CentralAsync
from coordinator.core.strategies.central_sync import CentralSync
from coordinator.core.strategies.decentral_async import DecentralAsync
from coordinator.core.strategies.decentral_sync import DecentralSync
from coordinator.core.strategies.layer_split import LayerSplit
from coordinator.core.strategies.rounds import RoundStrategy, fewest_averaged

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (CentralSync, CentralAsync, DecentralSync, DecentralAsync)
}


def serves_prefetch(job: JobConfig) -> bool:
    """The job's coordinator may answer ``prefetch`` (docs/protocol.md §3.12): the
    job allows it (``lease.prefetch`` true or ``auto``; which connections get it is
    handshake.offers_prefetch) and its strategy has a next task while one computes
    (``Strategy.pipelined``)."""
    return job.lease.prefetch is not False and STRATEGIES[job.strategy.name].pipelined


def in_rounds(job: JobConfig) -> bool:
    """The job's strategy runs synchronous rounds: every volunteer of a round
    starts from the version the last one made (rounds.py)."""
    return issubclass(STRATEGIES[job.strategy.name], RoundStrategy)


def averaged_in_rounds(job: JobConfig, workers: int) -> int:
    """What ``Strategy.averaged_with`` says for a task of this job with ``workers``
    connected: a round's fewest averaged results (its ``clients_per_round`` or every
    worker), 1 for a job that merges each result on its own."""
    if not in_rounds(job):
        return 1
    return fewest_averaged(job.strategy, job.strategy.clients_per_round or workers)


def make_strategy(
    *,
    model: ModelState,
    config: StrategySection,
    data: DataSection,
    rng: np.random.Generator,
    split: tuple[SplitBlocks, Boundaries] | None = None,
) -> Strategy:
    """The job's strategy; ``split``: a layer-split job's blocks and boundary shards,
    scheduled by LayerSplit (FedAsync per block) whatever ``config.name`` says."""
    if split is not None:
        blocks, boundaries = split
        return LayerSplit(
            blocks=blocks, boundaries=boundaries, model=model, config=config, data=data, rng=rng
        )
    try:
        cls = STRATEGIES[config.name]
    except KeyError:
        raise ValueError(
            f"strategy.name: unknown {config.name!r}; known: {sorted(STRATEGIES)}"
        ) from None
    return cls(model=model, config=config, data=data, rng=rng)
