"""The seed's speedup estimator (seed 001, chapter 4), extended to our four strategies.

From two measured numbers, ``t_grad`` (one mini-batch gradient on a worker) and ``t_comm`` (one
transfer of the model's weights between a worker and the parameter server), ``D`` mini-batch
steps in total and ``N`` workers, it predicts the training time and the speedup ``S =
D·t_grad / t_parallel`` of the synchronous and asynchronous central strategies, and of the
decentral ones as the central ones run on ``tau`` local steps per exchange. ``contention =
"shared"`` is the seed's estimator verbatim (all N transfers share the server's link);
``"independent"`` gives each client its own link. ``prefetch`` is decentral-async with each
worker asking for its next task while it computes. The baseline "linear" is one machine doing
all ``D`` steps itself, at ``t_grad_server``. The formulas, with the seed's equation numbers:
docs/simulations.md ("The speedup estimator").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from compression import CodecId
from coordinator.core.config import JobConfig
from coordinator.core.handshake import offers_prefetch
from coordinator.core.linkcodecs import choose, delta_versions
from coordinator.core.strategies import averaged_in_rounds, in_rounds, serves_prefetch
from coordinator.core.submodel import encoded_bytes
from nn.spec import ModelSpec
from protocol.limits import LinkLimits

Contention = Literal["shared", "independent"]
STRATEGIES = ("linear", "central-sync", "central-async", "decentral-sync", "decentral-async")


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanInputs:
    """What the estimator needs; times in seconds."""

    t_grad: float  # one mini-batch gradient on a client
    t_comm: float  # one transfer of the weights (or an update) one way
    workers: int
    steps: int = 100  # D: mini-batch steps in total
    tau: int = 10  # local steps per exchange (decentral)
    t_grad_server: float | None = None  # the linear baseline's step; default t_grad
    contention: Contention = "shared"
    prefetch: bool = False  # decentral-async overlaps transfers with compute

    def __post_init__(self) -> None:
        for name in ("t_grad", "t_comm"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"plan: {name} must be a finite time >= 0, got {v!r}")
        if self.t_grad_server is not None and not self.t_grad_server > 0:
            raise ValueError(f"plan: t_grad_server must be > 0, got {self.t_grad_server!r}")
        for name in ("workers", "steps", "tau"):
            if getattr(self, name) < 1:
                raise ValueError(f"plan: {name} must be >= 1, got {getattr(self, name)!r}")
        if self.contention not in ("shared", "independent"):
            raise ValueError("plan: contention must be 'shared' or 'independent'")
        if self.prefetch and self.contention != "independent":
            raise ValueError("plan: prefetch is modelled for independent links only")


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    strategy: str
    seconds: float
    speedup: float  # against linear

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sync_time(
    t_grad: float, t_comm: float, n: int, iterations: float, contention: Contention
) -> float:
    """Seed 001, 4.2 and 4.11: iterations × the mean of best and worst iteration."""
    if contention == "independent":
        return iterations * (2 * t_comm + t_grad)
    best = (n + 1) * t_comm + t_grad
    worst = 2 * n * t_comm + t_grad
    return iterations * (best + worst) / 2


def async_time(t_grad: float, t_comm: float, n: int, d: float, contention: Contention) -> float:
    """Seed 001, 4.13–4.20: the mean of best and worst total time for ``d`` gradients."""
    if contention == "independent":
        return d / n * (2 * t_comm + t_grad)
    best = max((n - 1) * t_comm + d / n * (2 * t_comm + t_grad), (d + 1) * t_comm + t_grad)
    worst = d / n * (2 * n * t_comm + t_grad)
    return (best + worst) / 2


def pipelined_time(t_grad: float, t_comm: float, n: int, d: float) -> float:
    """A worker that prefetches: its transfers hide behind its compute (see above)."""
    return 2 * t_comm + d / n * max(t_grad, t_comm)


def estimate(p: PlanInputs) -> list[Estimate]:
    """Predicted time and speedup against linear for each strategy, in STRATEGIES order."""
    n, d, tau, c = p.workers, p.steps, p.tau, p.contention
    linear = d * (p.t_grad_server if p.t_grad_server is not None else p.t_grad)
    times = {
        "linear": linear,
        "central-sync": sync_time(p.t_grad, p.t_comm, n, d / n, c),
        "central-async": async_time(p.t_grad, p.t_comm, n, d, c),
        "decentral-sync": sync_time(tau * p.t_grad, p.t_comm, n, d / (n * tau), c),
        "decentral-async": (
            pipelined_time(tau * p.t_grad, p.t_comm, n, d / tau)
            if p.prefetch
            else async_time(tau * p.t_grad, p.t_comm, n, d / tau, c)
        ),
    }
    return [
        Estimate(strategy=s, seconds=t, speedup=linear / t if t > 0 else math.inf)
        for s, t in times.items()
    ]


def transfer_seconds(nbytes: int, limits: LinkLimits, latency: float = 0.0) -> float:
    """One transfer of ``nbytes`` cut into frames of at most ``max_message_bytes``."""
    frames = max(1, math.ceil(nbytes / limits.max_message_bytes))
    return limits.transfer_seconds(nbytes, frames) + latency


def job_bytes_per_param(job: JobConfig, limits: LinkLimits, workers: int = 1) -> float:
    """Bytes a parameter takes on this link in this job, each way on average (the
    model down and the update up, in steady state): the job's codecs, or the
    slow-link ones where the coordinator gives them to a client on such a link
    (coordinator/core/linkcodecs.py; every in-tree client lists them).

    The model comes down as a delta where the link gets deltas and the client still
    holds a version the coordinator keeps: always in rounds, whose volunteers hold
    the round's version; asynchronously while ``workers`` (about the merges between
    a client's two tasks, one per result) stay within the versions kept. The update
    goes up in the codec the coordinator asks of such a round (averaged_in_rounds)."""
    codecs = choose(job, job.spec, limits, {int(c) for c in CodecId})
    down = codecs.model_bytes
    if codecs.delta is not None and (in_rounds(job) or workers <= delta_versions(job)):
        down = encoded_bytes(job.spec, codecs.delta)
    _, up = codecs.update_for(averaged_in_rounds(job, workers))
    return (down + up) / 2 / job.spec.num_params


def job_prefetches(job: JobConfig, limits: LinkLimits) -> bool:
    """Whether the coordinator offers prefetch to a client on this link in this job
    (coordinator/core/handshake.py's offers_prefetch, in the link's codecs)."""
    codecs = choose(job, job.spec, limits, {int(c) for c in CodecId})
    return serves_prefetch(job) and offers_prefetch(job, codecs, limits)


def inputs_from_model(
    spec: ModelSpec,
    *,
    limits: LinkLimits,
    workers: int,
    batch: int = 16,
    client_flops: float,
    server_flops: float,
    latency: float = 0.0,
    steps: int = 100,
    tau: int = 10,
    bytes_per_param: float = 4.0,
    contention: Contention = "independent",
    prefetch: bool = False,
) -> PlanInputs:
    """t_grad from the model's FLOPs and a compute rate; t_comm from a link profile.

    ``bytes_per_param`` is 4 for fp32 and less with an update codec (2 for fp16,
    about 1 for int8).
    """
    if not client_flops > 0 or not server_flops > 0:
        raise ValueError("plan: compute rates must be > 0 FLOP/s")
    flops = spec.flops_per_sample(train=True) * batch
    nbytes = math.ceil(spec.num_params * bytes_per_param)
    return PlanInputs(
        t_grad=flops / client_flops,
        t_comm=transfer_seconds(nbytes, limits, latency),
        t_grad_server=flops / server_flops,
        workers=workers,
        steps=steps,
        tau=tau,
        contention=contention,
        prefetch=prefetch,
    )
