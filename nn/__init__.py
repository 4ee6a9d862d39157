"""The numba MLP core: model spec and presets, Params, kernels, optimizers, data.

Importing ``nn`` stays light (no numba): training lives in ``nn.train``, whose
``train_steps``, ``compute_gradient``, ``evaluate`` and ``predict`` compile on
first use and are cached on disk afterwards (``nn.jitcache`` drops that cache
when the sources change).
"""

from pathlib import Path

from nn.data import Dataset, load_dataset, load_digits, shard, teacher_task
from nn.jitcache import keep_in_step
from nn.optim import Optimizer, OptState
from nn.params import NeuronGroup, Params, plan_groups
from nn.spec import PRESETS, ModelSpec

keep_in_step(Path(__file__).parent)

__all__ = [
    "PRESETS",
    "Dataset",
    "ModelSpec",
    "NeuronGroup",
    "OptState",
    "Optimizer",
    "Params",
    "load_dataset",
    "load_digits",
    "plan_groups",
    "shard",
    "teacher_task",
]
