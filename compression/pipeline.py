"""The compression pipeline behind ``crowdgrad compress``: distill, prune, quantize.

Order matters and is fixed: distillation first (it picks the architecture and
needs a float teacher), then pruning with fine-tuning (float training), then
quantization last (int8 weights are not trained further). Each stage is optional.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from compression.distill import distill
from compression.prune import finetune, magnitude_prune, prune_neurons
from compression.quantize import QuantizedModel, quantize_model
from compression.report import ModelStats, measure
from nn.data import Dataset
from nn.params import Params
from nn.spec import ModelSpec

PRUNE_MODES = ("structured", "unstructured")
QUANTIZE = ("int8",)


@dataclass(frozen=True, slots=True, kw_only=True)
class CompressConfig:
    """What to do; ``None``/0 skips a stage."""

    distill_widths: tuple[int, ...] | None = None
    distill_steps: int = 3000
    temperature: float = 4.0
    alpha: float = 0.7
    prune: float = 0.0
    prune_mode: str = "structured"
    finetune_steps: int = 300
    quantize: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.prune_mode not in PRUNE_MODES:
            raise ValueError(f"prune_mode: expected one of {PRUNE_MODES}, got {self.prune_mode!r}")
        if self.quantize is not None and self.quantize not in QUANTIZE:
            raise ValueError(f"quantize: expected one of {QUANTIZE}, got {self.quantize!r}")
        if not 0 <= self.prune < 1:
            raise ValueError(f"prune: must be a fraction in [0, 1), got {self.prune}")
        for name in ("distill_steps", "finetune_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class CompressResult:
    model: Params | QuantizedModel
    before: ModelStats
    after: ModelStats
    stages: list[str] = field(default_factory=list)


def compress(params: Params, data: Dataset, config: CompressConfig) -> CompressResult:
    """Run the configured stages on ``params`` (not modified) against ``data``."""
    if data.X_train.shape[1] != params.spec.widths[0]:
        raise ValueError(
            f"dataset {data.name!r} has {data.X_train.shape[1]} features, the model's input "
            f"width is {params.spec.widths[0]}"
        )
    before = measure(params, data.X_test, data.y_test)
    stages: list[str] = []
    model = params.copy()
    rng = np.random.default_rng(config.seed)
    if config.distill_widths is not None:
        student_spec = ModelSpec(
            widths=config.distill_widths, loss=params.spec.loss, init=params.spec.init
        )
        model = distill(
            model, student_spec, data.X_train, data.y_train, steps=config.distill_steps,
            temperature=config.temperature, alpha=config.alpha, seed=config.seed,
        )  # fmt: skip
        stages.append(f"distill -> {list(student_spec.widths)} ({config.distill_steps} steps)")
    if config.prune > 0:
        if config.prune_mode == "structured":
            model, _ = prune_neurons(model, config.prune)
            finetune(model, data.X_train, data.y_train, steps=config.finetune_steps, rng=rng)
            stages.append(
                f"prune {config.prune:.0%} of hidden neurons -> {list(model.spec.widths)}"
            )
        else:
            model, masks = magnitude_prune(model, config.prune)
            finetune(
                model, data.X_train, data.y_train, steps=config.finetune_steps, rng=rng,
                masks=masks,
            )  # fmt: skip
            stages.append(f"prune {config.prune:.0%} of weights (unstructured)")
        stages.append(f"fine-tune {config.finetune_steps} steps")
    final: Params | QuantizedModel = model
    if config.quantize == "int8":
        final = quantize_model(model)
        stages.append("quantize int8, per-row scales")
    after = measure(final, data.X_test, data.y_test)
    return CompressResult(model=final, before=before, after=after, stages=stages)
