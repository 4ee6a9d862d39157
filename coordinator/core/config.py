"""The job file: what to train, on which data, with which strategy and limits.

A job is a TOML file validated by pydantic models (every section forbids unknown
keys, so a typo is an error rather than a silently ignored setting). Loading
reports *every* bad field at once, each with its dotted path, because a job file
is usually fixed by a person reading the error::

    [model]
    widths = [64, 128, 10]

    [data]
    dataset = "digits"
    shards = 8

    [strategy]
    name = "decentral-async"
    tau = 10

The defaults describe a small, working decentral-async job on digits.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from compression import CodecError, get
from coordinator.core.strategyconfig import (
    STRATEGY_NAMES,
    WINDOW_AUTO,
    WINDOW_AUTO_BYTES,
    WINDOW_AUTO_CLIENTS_PER_DELTA,
    WINDOW_AUTO_MIN,
    ScheduleSection,
    StalenessSection,
    StrategyName,
    StrategySection,
    _Section,
)
from nn.spec import ModelSpec

__all__ = [
    "STRATEGY_NAMES",
    "WINDOW_AUTO",
    "WINDOW_AUTO_BYTES",
    "WINDOW_AUTO_CLIENTS_PER_DELTA",
    "WINDOW_AUTO_MIN",
    "JobConfig",
    "JobConfigError",
    "ScheduleSection",
    "StalenessSection",
    "StrategyName",
    "StrategySection",
    "load_job",
    "parse_job",
]


class JobConfigError(ValueError):
    """A job file is invalid; ``errors`` holds ``(path, message)`` for every bad field."""

    def __init__(self, source: str, errors: list[tuple[str, str]]) -> None:
        self.source = source
        self.errors = errors
        lines = [f"{source}: {len(errors)} invalid field(s)"]
        lines += [f"  {path}: {msg}" for path, msg in errors]
        super().__init__("\n".join(lines))


class ModelSection(_Section):
    """Either explicit ``widths`` or a seed ``preset``; ``init_seed`` seeds the weights."""

    widths: list[int] | None = None
    preset: str | None = None
    activations: list[str] = Field(default_factory=list)
    loss: Literal["mse", "softmax_ce"] = "softmax_ce"
    init: Literal["he", "xavier"] = "he"
    #: sent as ``task.init_seed``: at most 2^53 - 1, exact in a JavaScript number
    init_seed: int = Field(default=0, ge=0, le=2**53 - 1)

    @model_validator(mode="after")
    def _check_spec(self) -> ModelSection:
        if (self.widths is None) == (self.preset is None):
            raise ValueError("give exactly one of 'widths' or 'preset'")
        self.spec()  # raises ValueError naming the bad field
        return self

    def spec(self) -> ModelSpec:
        if self.preset is not None:
            return ModelSpec.preset(
                self.preset, loss=self.loss, activations=tuple(self.activations), init=self.init
            )
        return ModelSpec(
            widths=tuple(self.widths or ()),
            activations=tuple(self.activations),
            loss=self.loss,
            init=self.init,
        )


class DataSection(_Section):
    """The dataset and how it is cut into shards: a built-in ``dataset`` name
    (``digits``, ``teacher:<preset>``) or a user's file ``path`` (``.npz`` with
    arrays X and y, or ``.csv`` with a ``label`` column; nn/datafile.py). A
    relative path is relative to the job file."""

    dataset: str | None = None
    path: str | None = None
    label: str | None = None
    shards: int = Field(default=8, ge=1)
    sharding: Literal["iid", "label_skew"] = "iid"
    seed: int = 0
    batch: int = Field(default=16, ge=1)

    @model_validator(mode="after")
    def _one_source(self) -> DataSection:
        if self.path is not None and self.dataset is not None:
            raise ValueError("give either 'dataset' (a built-in name) or 'path' (a file)")
        if self.path is None and self.dataset is None:
            object.__setattr__(self, "dataset", "digits")  # the default job's data
        if self.label is not None and (self.path is None or not self.path.endswith(".csv")):
            raise ValueError("'label' names the label column of a .csv 'path'")
        return self

    @property
    def source(self) -> str:
        """What the data is called in logs and status: the file's path or the name."""
        return self.path if self.path is not None else str(self.dataset)


class LinkSection(_Section):
    """A named link profile; explicit values override the profile's."""

    profile: str = "lan"
    bytes_per_s: float | None = Field(default=None, gt=0)
    messages_per_s: float | None = Field(default=None, gt=0)
    max_message_bytes: int | None = Field(default=None, ge=1024)


class LeaseSection(_Section):
    """Deadline = max(min_s, slack × predicted compute+transfer time). ``prefetch``:
    offer clients their next task while they compute (decentral-async only):
    ``auto`` to a connection whose link sets its task's length (linkcodecs.link_bound),
    true to every one, false to none."""

    min_s: float = Field(default=10.0, gt=0)
    slack: float = Field(default=3.0, ge=1)
    heartbeat_interval_s: float = Field(default=5.0, gt=0)
    heartbeat_timeout_s: float = Field(default=20.0, gt=0)
    resume_grace_s: float = Field(default=60.0, ge=0)
    max_resumable: int = Field(
        default=10_000,
        ge=0,
        description="clients that left kept for resuming, at most (their records, and "
        "two tasks each held open for their resume grace); the first to leave goes first",
    )
    max_resumable_unproven: int = Field(
        default=1_000,
        ge=0,
        description="of those, clients that left before any result of theirs was "
        "accepted (a flood of connections that take a task and vanish is all such)",
    )
    prefetch: bool | Literal["auto"] = Field(
        default="auto",
        description="lease a task behind the running one when a client asks (protocol §3.12); "
        "'auto': only on a slow link, whose transfers then run while it computes; on lan a "
        "prefetched task's model one result older cost 2 clients half their work",
    )

    @model_validator(mode="after")
    def _timeout_after_interval(self) -> LeaseSection:
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ValueError("heartbeat_timeout_s must exceed heartbeat_interval_s")
        return self


class StopSection(_Section):
    """The job ends at the first condition met; all None and ``patience`` 0 mean it
    runs until stopped."""

    target_accuracy: float | None = Field(default=None, gt=0, le=1)
    max_versions: int | None = Field(default=None, ge=1)
    max_time_s: float | None = Field(default=None, gt=0)
    # early stopping (earlystop.py): this many held-out evaluations in a row
    # without a new best end the job as "converged", with the best
    # evaluation's model as the final one when it is kept; 0: never
    patience: int = Field(
        default=40, ge=0, description="evaluations without a new best that end the job"
    )
    # what "best" is: held-out accuracy, loss, or "auto" (accuracy for softmax_ce)
    monitor: Literal["auto", "accuracy", "loss"] = "auto"
    keep_best_mib: float = Field(
        default=256.0, ge=0, allow_inf_nan=False,
        description="keep the best model in memory (to end with it) up to this size",
    )  # fmt: skip


class CheckpointSection(_Section):
    every_versions: int = Field(default=0, ge=0, description="0 disables checkpoints")


class EvalSection(_Section):
    # every version by default: the lr's plateau rule and the early stop count
    # evaluations, so their clock is this cadence (with 1-s tasks, 10 versions
    # were ~5 s a step of it, against 0.5 s on one machine); a served
    # coordinator spends at most max_share of its core thread on them anyway
    every_versions: int = Field(default=1, ge=1)
    max_samples: int | None = Field(default=None, ge=1)
    max_share: float = Field(
        default=0.05,
        gt=0,
        le=1,
        description="most of the core thread's time spent on evaluations (timed runs only)",
    )


class ValidationSection(_Section):
    """Update checks; a norm above ``norm_multiple`` × running median is rejected."""

    norm_multiple: float = Field(default=10.0, gt=1)
    norm_window: int = Field(default=64, ge=1)
    norm_warmup: int = Field(default=4, ge=1)
    clip_multiple: float | None = Field(
        default=3.0, gt=0, description="scale accepted updates down to this × the median norm"
    )
    reference_tasks: int = Field(
        default=3, ge=0, description="updates the coordinator computes itself to seed the median"
    )
    max_rejections: int = Field(default=5, ge=1)


class ReplicationSection(_Section):
    """Adaptive replication (coordinator/core/replication.py): a share of tasks is leased
    to a second client and the two results compared; a client trusted after
    ``trust_after`` agreeing results is replicated with probability ``1/trust``,
    never below ``min_rate``. Off by default: until clients are trusted it costs up
    to half the compute, and it needs exact codecs (checked below)."""

    enabled: bool = False
    trust_after: int = Field(default=10, ge=1, description="agreeing results to be trusted")
    base_rate: float = Field(default=1.0, gt=0, le=1, description="replication of the untrusted")
    min_rate: float = Field(default=0.05, ge=0, le=1, description="floor of 1/trust")
    # docs/protocol.md §12.8: |got - want| <= atol + rtol·|want| for a conforming client
    rtol: float = Field(default=1e-4, ge=0)
    atol: float = Field(default=1e-5, ge=0)
    slack: float = Field(
        default=2.0, ge=1, description="two conforming results may differ by twice the tolerance"
    )
    distance: float = Field(
        default=1e-3,
        ge=0,
        description="results this close in relative L2 distance agree too (a ReLU that "
        "flips on a rounding difference moves a few values far, not the update)",
    )
    strikes: int = Field(
        default=3,
        ge=1,
        description="proven disagreements among its last strike_window checked results "
        "that exclude a client",
    )
    strike_window: int = Field(
        default=20,
        ge=1,
        le=1000,
        description="checked results a client's strikes are counted over (a conforming "
        "client lands outside the tolerance about once in 2,000, a liar every time)",
    )
    twin_wait_s: float = Field(
        default=10.0,
        ge=0,
        description="seconds a twin waits for a client of its primary holder's kernel "
        "family (hello.kernel) before a client of any family may take it",
    )
    exclude: bool = Field(default=True, description="close and refuse a client caught lying")
    snapshot_mib: float = Field(
        default=256.0, gt=0, description="memory for model versions kept for twins"
    )
    revert_mib: float = Field(
        default=64.0, ge=0, description="memory for recent unverified steps, to revert a liar's"
    )

    @model_validator(mode="after")
    def _window_holds_the_strikes(self) -> ReplicationSection:
        if self.strike_window < self.strikes:
            raise ValueError(
                f"strike_window ({self.strike_window}) must be >= strikes ({self.strikes})"
            )
        return self


class CodecSection(_Section):
    """Codec names (``compression.codecs.get`` grammar) for each direction.

    ``model`` encodes full-model downloads, ``update`` the clients' results. With
    ``delta`` set, a client already holding a recent version downloads only
    ``current − held`` in that codec (full model when the held version is older
    than the last ``delta_versions`` served, or after ``max_delta_chain`` deltas
    in a row, which bounds the drift a lossy delta codec accumulates).
    ``error_feedback`` makes clients keep what the update codec dropped and add
    it to their next update.

    ``slow_link``: the codecs of the transfers (model, delta, update) to a client
    whose link, not its compute, sets its task's length (coordinator/core/linkcodecs.py):
    ``auto`` is ``int8`` models and ``int4-sr`` updates and deltas for a job on the
    default fp32 codecs without replication, sub-model or layer-split tasks and off
    otherwise (and it sends them deltas even with ``delta`` unset); a codec name is
    that codec every way; ``off`` keeps every client on the codecs above.
    """

    model: str = "fp32"
    update: str = "fp32"
    error_feedback: bool = False
    delta: str | None = None
    delta_versions: int = Field(default=16, ge=1)
    max_delta_chain: int = Field(default=16, ge=1)
    slow_link: str = "auto"

    @model_validator(mode="after")
    def _known_codecs(self) -> CodecSection:
        for key in ("model", "update", "delta", "slow_link"):
            name = getattr(self, key)
            if name is None or (key == "slow_link" and name in ("auto", "off")):
                continue
            try:
                get(name)
            except CodecError as exc:
                raise ValueError(f"{key}: {exc}") from None
        return self


class DistillSection(_Section):
    """Knowledge distillation as the job: the model is the student, ``teacher`` an
    ``nn.modelfile`` path; train tasks become ``distill`` tasks that carry the
    teacher's logits for their shard (the teacher itself never leaves the server)."""

    teacher: str | None = None
    temperature: float = Field(default=4.0, ge=1e-3, le=1e3)
    alpha: float = Field(default=0.7, ge=0, le=1, description="weight of the soft targets")


class SubmodelSection(_Section):
    """Sub-model tasks (docs/coordinator.md, "Sub-model tasks"): each task trains a
    subnet of the model, a subset of every hidden layer's neurons, and moves only
    its slice. ``mode``: ``random`` draws each task's neurons afresh (Federated
    Dropout), ``ist`` hands out a fresh partition of each layer block by block so
    consecutive tasks train disjoint neurons (independent subnet training),
    ``nested`` keeps each layer's first neurons, so a smaller subnet is part of
    every larger one (FjORD's ordered dropout). ``fraction`` is the share of every
    hidden layer a task keeps at most; a client gets less when its slice would
    exceed ``budget_bytes`` or its task (download, compute, upload) would take
    longer than ``max_task_s`` at its link's rate and its measured speed.
    ``group``: neurons are chosen in groups of that many consecutive ones, so a
    slice and a merge touch contiguous runs of each row (on a mapped model, a
    few pages per row rather than all of them).
    """

    mode: Literal["off", "random", "ist", "nested"] = "off"
    fraction: float = Field(default=0.25, gt=0, le=1)
    budget_bytes: int | None = Field(default=None, ge=256)
    group: int = Field(
        default=1,
        ge=1,
        description="neurons per group: a subnet keeps whole groups of consecutive neurons",
    )
    max_task_s: float | None = Field(default=None, gt=0)
    rescale: Literal["mean", "variance", "none"] = Field(
        default="mean",
        description="kept outgoing weights travel at n/k (mean: inverted dropout), "
        "sqrt(n/k) (variance: deep nets cut thin), or as they are",
    )

    @property
    def rescale_exponent(self) -> float:
        return {"mean": 1.0, "variance": 0.5, "none": 0.0}[self.rescale]

    @property
    def enabled(self) -> bool:
        return self.mode != "off"


class SplitSection(_Section):
    """Layer-split training (docs/coordinator.md, "Layer-split jobs"): ``cut`` = c
    cuts the model after hidden layer c into a lower block (the layers below,
    trained through an auxiliary linear head to the outputs) and an upper block
    (the rest); each task trains one block (docs/protocol.md §3.3.2), and a lower
    task's result carries its rows' boundary activations, which upper tasks
    train on. ``waiting``: boundary shards kept for upper tasks (the oldest not
    yet leased goes when one more comes). ``cut = 0``: no split (the default)."""

    cut: int = Field(default=0, ge=0)
    waiting: int = Field(default=4, ge=1, le=1024)

    @property
    def enabled(self) -> bool:
        return self.cut > 0


class JobConfig(_Section):
    name: str = "job"
    model: ModelSection = Field(default_factory=lambda: ModelSection(widths=[64, 128, 10]))
    data: DataSection = Field(default_factory=DataSection)
    strategy: StrategySection = Field(default_factory=StrategySection)
    link: LinkSection = Field(default_factory=LinkSection)
    lease: LeaseSection = Field(default_factory=LeaseSection)
    stop: StopSection = Field(default_factory=StopSection)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    validation: ValidationSection = Field(default_factory=ValidationSection)
    replication: ReplicationSection = Field(default_factory=ReplicationSection)
    codecs: CodecSection = Field(default_factory=CodecSection)
    distill: DistillSection = Field(default_factory=DistillSection)
    submodel: SubmodelSection = Field(default_factory=SubmodelSection)
    split: SplitSection = Field(default_factory=SplitSection)

    @model_validator(mode="after")
    def _distill_needs_train_tasks(self) -> JobConfig:
        if self.distill.teacher is not None:
            if not self.strategy.name.startswith("decentral"):
                raise ValueError("distill.teacher: needs a decentral-* strategy (train tasks)")
            if self.model.loss != "softmax_ce":
                raise ValueError("distill.teacher: the student needs loss = 'softmax_ce'")
        return self

    @model_validator(mode="after")
    def _replication_needs_comparable_results(self) -> JobConfig:
        """Two honest results agree only if both clients start from the same bits and
        upload them exactly; a sync round would wait on every held result."""
        if not self.replication.enabled:
            return self
        if self.strategy.name not in ("decentral-async", "central-async"):
            raise ValueError("replication.enabled: needs an async strategy")
        c = self.codecs
        if c.model != "fp32" or c.update != "fp32" or c.delta not in (None, "fp32"):
            raise ValueError("replication.enabled: needs fp32 codecs (model, update, delta)")
        if c.slow_link not in ("auto", "off", "fp32"):
            raise ValueError(
                f"replication.enabled: needs fp32 codecs; codecs.slow_link {c.slow_link!r} "
                "would make a slow client's results differ (use 'auto' or 'off')"
            )
        if c.error_feedback:
            raise ValueError("replication.enabled: error feedback makes results differ")
        return self

    @model_validator(mode="after")
    def _submodel_needs_local_mean(self) -> JobConfig:
        """A subnet's update covers part of the model: a mean can count each
        coordinate over the updates that hold it, a median or Krum would compare
        zeros with deltas; twins would need the same subnet and version."""
        if not self.submodel.enabled:
            return self
        st = self.strategy
        if not st.name.startswith("decentral"):
            raise ValueError("submodel.mode: needs a decentral-* strategy (train tasks)")
        combines = st.name == "decentral-sync" or st.aggregation == "fedbuff"
        if combines and st.aggregator != "mean":
            raise ValueError(
                f"submodel.mode: strategy.aggregator {st.aggregator!r} compares whole "
                "updates; sub-model updates combine by a per-coordinate mean"
            )
        if self.replication.enabled:
            raise ValueError("submodel.mode: replication of sub-model tasks is not supported")
        if self.codecs.slow_link not in ("auto", "off"):
            raise ValueError(
                "codecs.slow_link: a sub-model job sizes its slices in its own codecs "
                "(codecs.model, codecs.update); use 'auto' or 'off'"
            )
        if self.codecs.error_feedback and self.submodel.mode != "nested":
            raise ValueError(
                "codecs.error_feedback: a client's residual belongs to its last subnet's "
                "neurons; with submodel.mode random or ist the next task has others"
            )
        if self.model.spec().num_layers < 2:
            raise ValueError("submodel.mode: the model has no hidden layer to split")
        return self

    @model_validator(mode="after")
    def _split_needs_one_step_per_result(self) -> JobConfig:
        """A block's result moves only that block: it lands alone (FedAsync with
        no window), since a window or a round would combine updates of two blocks
        as if they were one model's; everything that compares or replays whole
        updates is out."""
        if not self.split.enabled:
            return self
        hidden = self.model.spec().num_layers - 1
        if self.split.cut > hidden:
            raise ValueError(f"split.cut: a hidden layer 1..{hidden}, got {self.split.cut}")
        st = self.strategy
        if st.name != "decentral-async" or st.aggregation != "fedasync" or st.window != 1:
            raise ValueError(
                "split.cut: needs strategy.name 'decentral-async', aggregation 'fedasync' "
                "and window = 1 (each block's result lands alone)"
            )
        for key in ("update", "slow_link"):
            name = getattr(self.codecs, key)
            if name.startswith("topk"):
                raise ValueError(
                    f"split.cut: codecs.{key} {name!r} keeps a few values of "
                    "each block, and a lower result's boundary activations travel in it "
                    "too; use a dense codec (fp32, fp16, int8, int4)"
                )
        for on, what in (
            (self.submodel.enabled, "submodel.mode"),
            (self.replication.enabled, "replication.enabled"),
            (self.distill.teacher is not None, "distill.teacher"),
            (self.codecs.error_feedback, "codecs.error_feedback"),
        ):
            if on:
                raise ValueError(f"split.cut: not with {what}")
        return self

    @property
    def spec(self) -> ModelSpec:
        return self.model.spec()

    def replace(self, **sections: Mapping[str, Any]) -> JobConfig:
        """A copy with some sections' fields changed, validated again (handy in tests)."""
        data = self.model_dump()
        for key, fields in sections.items():
            if isinstance(data.get(key), dict):
                data[key] = {**data[key], **fields}
            else:
                data[key] = fields
        return parse_job(data, source="<replace>")


def _errors(exc: ValidationError) -> list[tuple[str, str]]:
    out = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "<root>"
        msg = err["msg"].removeprefix("Value error, ")
        out.append((path, msg))
    return out


def parse_job(data: Mapping[str, Any], *, source: str = "<job>") -> JobConfig:
    """Validate a mapping (parsed TOML); raises JobConfigError listing every bad field."""
    try:
        return JobConfig.model_validate(dict(data))
    except ValidationError as exc:
        raise JobConfigError(source, _errors(exc)) from None


def load_job(path: str | Path) -> JobConfig:
    """Read and validate a TOML job file."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise JobConfigError(str(p), [("<file>", f"cannot read: {exc.strerror}")]) from None
    except tomllib.TOMLDecodeError as exc:
        raise JobConfigError(str(p), [("<toml>", str(exc))]) from None
    job = parse_job(data, source=str(p))
    # Relative paths in the file are relative to the file, not to wherever the
    # coordinator was started from: [data] path and [distill] teacher alike.
    if job.data.path is not None and not Path(job.data.path).is_absolute():
        data_path = str(p.parent / job.data.path)
        job = job.model_copy(update={"data": job.data.model_copy(update={"path": data_path})})
    teacher = job.distill.teacher
    if teacher is not None and not Path(teacher).is_absolute():
        distill = job.distill.model_copy(update={"teacher": str(p.parent / teacher)})
        job = job.model_copy(update={"distill": distill})
    return job
