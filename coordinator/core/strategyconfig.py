"""The job file's ``[strategy]`` table: the scheduling method and its settings.

Split from coordinator/core/config.py (the job file as a whole), which re-exports
every name here: a strategy's settings are read by the strategies and the core,
the rest of the job by everything else.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

StrategyName = Literal["central-sync", "central-async", "decentral-sync", "decentral-async"]
STRATEGY_NAMES: tuple[str, ...] = (
    "central-sync",
    "central-async",
    "decentral-sync",
    "decentral-async",
)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StalenessSection(_Section):
    """Step scale by staleness s: constant 1, polynomial (1+s)^-a, hinge 1/(a(s-b)+1) past b.

    Hinge by default, at a = 1 and b = 0, which is 1/(1+s): with N players a
    result is ~N versions stale and ~N arrive per task time, so the model moves
    ~N·f(N) per task time. The polynomial's N^(1-a) grows with the crowd (700
    players on digits collapsed to one class), the hinge's ~1/a does not. With
    a = 1 and b = 0 the tasks in flight together move the model by about their
    mean whatever their number (a one-client crowd with a prefetched task has
    two): a long task's delta is far from linear, and a sum of a few of them
    overshoots (docs/performance.md, "The crowd against the machine").

    ``count``: what s counts. ``versions`` (the default): every version since the
    task was created. ``overlap`` (decentral-async): the versions that touched
    the task's subnet's neurons, averaged over its neurons
    (coordinator/core/strategies/overlap.py): a sub-model slice is as old as its own
    coordinates, not the crowd's merges elsewhere. Without sub-model tasks they
    agree."""

    kind: Literal["constant", "polynomial", "hinge"] = "hinge"
    a: float = Field(default=1.0, ge=0)
    b: int = Field(default=0, ge=0)
    count: Literal["versions", "overlap"] = "versions"


class ScheduleSection(_Section):
    """A multiplier on every step the server takes, by model version: an async
    merge's weight (``alpha`` or the central lr, times the staleness scale) and
    a sync round's or FedBuff's outer lr.

    ``warmup-cosine``: from ``start`` rising linearly to ``peak`` over the first
    ``warmup`` versions, then down a half cosine to ``end`` at ``versions``, and
    ``end`` after that (``warmup = versions`` with ``end = peak``: a ramp that
    holds). ``constant``: 1. Why: in the huge preset's sub-model crowd, merges
    twice as heavy as the start stands diverge early but are what the late
    phase needs (loss 0.032 at 600 s against 0.086; docs/performance.md, "A
    schedule for the merge weight"), the warm-up of large-batch training."""

    kind: Literal["constant", "warmup-cosine"] = "constant"
    start: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    peak: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    end: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    warmup: int = Field(default=0, ge=0, description="versions rising from start to peak")
    versions: int = Field(default=0, ge=0, description="the version where end is reached")

    @model_validator(mode="after")
    def _phases_in_order(self) -> ScheduleSection:
        if self.kind != "constant" and (self.versions < 1 or self.versions < self.warmup):
            raise ValueError(
                f"versions must be >= 1 and >= warmup ({self.warmup}), got {self.versions}"
            )
        return self


#: "auto" windows: this many deltas, while they fit in this many bytes
WINDOW_AUTO = 16
WINDOW_AUTO_BYTES = 256 << 20
#: an "auto" window combines one delta per this many connected clients, and
#: none below WINDOW_AUTO_MIN (the delta alone): a window over a few clients'
#: deltas holds several from each, spanning many versions, and the lag slowed
#: 8 clients 2.4x and stalled 2 (docs/coordinator.md)
WINDOW_AUTO_CLIENTS_PER_DELTA = 4
WINDOW_AUTO_MIN = 4


class StrategySection(_Section):
    """Scheduling method and its hyperparameters; unused keys of other methods are ignored."""

    name: StrategyName = "decentral-async"
    tau: int | Literal["auto"] = Field(
        default="auto", description="local steps per task (decentral), or 'auto': per client"
    )
    # "auto" tau: a task computes for task_seconds and transfer_ratio x its transfer
    # time at the client's measured FLOP/s (core.task_steps), within tau_min..tau_max
    # and max_epochs passes over its shard. A quarter second, not one: the tasks
    # in flight move the model by about their mean, so shorter ones let a crowd
    # average more often (2 real clients on the 1,000,000-row job reached the
    # machine's 60-s accuracy 2.0x sooner than it, against 1.16x at 1;
    # docs/performance.md, "Session 10")
    task_seconds: float = Field(default=0.25, gt=0, le=600, allow_inf_nan=False)
    transfer_ratio: float = Field(default=5.0, ge=0, le=1000, allow_inf_nan=False)
    # The same for a connection that prefetches (lease.prefetch): its transfers
    # run while it computes, so a task as long as its round trip keeps the link
    # busy and the crowd averages twice as often as on one pass over a 64th of
    # the rows (64 roblox players: 0.78 at 275 s against 372 s; 8 players: 476
    # s against 568 s; half a round trip saturated the link and lost;
    # docs/performance.md, "Session 15")
    prefetch_transfer_ratio: float = Field(default=1.0, ge=0, le=1000, allow_inf_nan=False)
    # decentral-async: each task's lr = lr x min(lr_scale_max, K) ("linear") or
    # sqrt(K), K the crowd's concurrency (the running mean of staleness + 1): K
    # deltas merged at 1/(1+s) average away their noise, as a K-times batch
    # would, which a larger step can spend (the linear scaling rule). "auto":
    # linear for plain SGD tasks, none for momentum and Adam ones, whose scaled
    # lr went unstable (the huge preset's 64 players ended at loss 0.075 against
    # 0.036; docs/performance.md, "Session 12")
    lr_scaling: Literal["auto", "none", "linear", "sqrt"] = "auto"
    lr_scale_max: float = Field(default=4.0, ge=1, le=100, allow_inf_nan=False)
    # "auto" for SGD tasks in a crowd past K = lr_scale_max²: sqrt(K) (the gentler
    # rule of large batches) up to this, where linear stops at lr_scale_max. A cap
    # of 8 beat 4 with 64 roblox players (0.78 at 362 s against 433 s) and lost to
    # it with 14 lan clients and 8 roblox players, whose K stays under 16 and so
    # keep 4; 16 lost everywhere (docs/performance.md, "Session 14"). 1: linear only
    lr_scale_crowd_max: float = Field(default=8.0, ge=1, le=100, allow_inf_nan=False)
    # "auto": a task's crowd multiplier is at most max_scaled_steps / its local steps
    # (never below 1). A delta of a few steps is one step of a K-times batch, which
    # the scaling rule is for; a long task's delta is a trajectory, and scaled it
    # moves the model further per merge than later deltas can correct. Binds only
    # for fast clients with long tasks: 14 lan clients (2,100 steps) take 1.95x
    # instead of 4x and reach 0.9594 at 21.0 s instead of 31.0 s, best 0.972
    # against 0.965 (simulated); roblox tasks (50-100 steps) keep 4x-8x
    # (docs/performance.md, "Session 22")
    max_scaled_steps: int = Field(default=4096, ge=1)
    # decentral-async: the tasks' lr halves (plateau_factor) each time the
    # held-out loss has not reached a new best for plateau_patience evaluations,
    # down to plateau_min of it; 0 patience: never (a constant lr overfits and
    # grows noisy: 2 clients on the generated workload fell from 0.918 to 0.87)
    plateau_patience: int = Field(default=10, ge=0)
    plateau_factor: float = Field(default=0.5, gt=0, lt=1)
    plateau_min: float = Field(default=0.125, gt=0, le=1)
    # The plateau's and the early stop's clock (stop.patience) counts rounds: K
    # tasks of round_seconds of the client's compute, or one pass over the
    # task's shard where that is less; a shorter task counts for its share, so
    # that shorter tasks do not cut the lr sooner in training done (at 0.1-s
    # tasks 2 simulated clients cut three times by 18 s and stalled at 0.958;
    # docs/performance.md, "Session 11")
    round_seconds: float = Field(default=0.25, gt=0, le=600, allow_inf_nan=False)
    tau_min: int = Field(default=10, ge=1)
    tau_max: int = Field(default=5000, ge=1)
    max_epochs: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    lr: float = Field(default=0.05, gt=0, description="client lr, or server lr (central)")
    client_optimizer: Literal["sgd", "momentum", "adam"] = "sgd"
    momentum: float = Field(default=0.9, ge=0, lt=1)
    # sync rounds
    quorum: float = Field(default=0.75, gt=0, le=1)
    round_deadline_s: float = Field(default=30.0, gt=0)
    # once ceil(quorum x slots) have results, the round closes after this share
    # again of the time they took, where that is sooner than the deadline (the
    # slowest and the departed are not waited for); None: at the deadline
    quorum_grace: float | None = Field(default=None, ge=0, le=100, allow_inf_nan=False)
    clients_per_round: int | None = Field(default=None, ge=1)
    # async staleness
    staleness: StalenessSection = Field(default_factory=StalenessSection)
    max_staleness: int | None = Field(default=None, ge=0)
    # every server step, by version
    schedule: ScheduleSection = Field(default_factory=ScheduleSection)
    # outer optimizer (decentral-sync; central-sync uses it as the server optimizer)
    outer_optimizer: Literal["sgd", "nesterov"] = "sgd"
    # "auto" (decentral-sync): per round, 0.95 of the stability edge times the share
    # of the round's mean delta that is signal, times the plateau's decay
    # (aggregate.OuterLrScale; docs/performance.md, "Session 18")
    outer_lr: float | Literal["auto"] = Field(default=1.0, description="a number > 0, or 'auto'")
    outer_momentum: float = Field(default=0.9, ge=0, lt=1)
    # decentral-async merge
    aggregation: Literal["fedasync", "fedbuff", "diloco"] = "fedasync"
    alpha: float = Field(default=1.0, gt=0, le=1, description="FedAsync mixing weight")
    buffer_k: int = Field(default=4, ge=1, description="FedBuff deltas per outer step")
    # FedAsync: each arrival steps by the robust combination of the newest deltas
    # (robust.SlidingWindow); "auto" is 16 while the window fits in
    # WINDOW_AUTO_BYTES, 1 (each delta alone, no protection) is classic FedAsync
    window: int | Literal["auto"] = Field(
        default="auto", description="FedAsync: deltas combined per step, or 'auto'"
    )
    window_aggregator: Literal["mean", "median", "trimmed_mean", "krum", "centered_clip"] = (
        "centered_clip"
    )
    # how a round's results or a FedBuff buffer combine (coordinator/core/strategies/robust.py)
    aggregator: Literal["mean", "median", "trimmed_mean", "krum", "centered_clip"] = "mean"
    byzantine_fraction: float = Field(
        default=0.2, ge=0, lt=0.5, description="share of updates a robust aggregator survives"
    )

    @field_validator("tau")
    @classmethod
    def _tau_positive(cls, tau: int | str) -> int | str:
        if tau != "auto" and int(tau) < 1:
            raise ValueError(f"must be 'auto' or >= 1, got {tau}")
        return tau

    @model_validator(mode="after")
    def _tau_bounds(self) -> StrategySection:
        if self.tau_max < self.tau_min:
            raise ValueError(f"tau_max ({self.tau_max}) must be >= tau_min ({self.tau_min})")
        return self

    @property
    def nominal_tau(self) -> int:
        """Local steps where one number stands for every task (reference norms, cost
        models): ``tau`` itself, or with ``"auto"`` the geometric middle of its bounds."""
        if self.tau != "auto":
            return self.tau
        return max(self.tau_min, min(self.tau_max, round((self.tau_min * self.tau_max) ** 0.5)))

    @field_validator("outer_lr")
    @classmethod
    def _outer_lr_positive(cls, lr: float | str) -> float | str:
        if lr != "auto" and not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"must be 'auto' or a finite number > 0, got {lr}")
        return lr

    @model_validator(mode="after")
    def _auto_outer_lr_needs_rounds(self) -> StrategySection:
        if self.outer_lr == "auto" and self.name != "decentral-sync":
            raise ValueError(
                f"outer_lr 'auto': needs decentral-sync (it scales with the deltas a "
                f"round averages), not {self.name!r}; give a number"
            )
        return self

    @model_validator(mode="after")
    def _window_in_range(self) -> StrategySection:
        if self.window != "auto" and not 1 <= self.window <= 64:
            raise ValueError(f"window must be 'auto' or 1..64, got {self.window}")
        return self

    @model_validator(mode="after")
    def _overlap_needs_decentral_async(self) -> StrategySection:
        if self.staleness.count == "overlap" and self.name != "decentral-async":
            raise ValueError(
                f"staleness.count 'overlap': needs decentral-async (its merges touch "
                f"subnets), not {self.name!r}"
            )
        return self

    def window_for(self, num_params: int) -> int:
        """The FedAsync window for a model of ``num_params`` float32 values."""
        if self.window != "auto":
            return self.window
        return max(1, min(WINDOW_AUTO, WINDOW_AUTO_BYTES // (4 * max(num_params, 1))))
