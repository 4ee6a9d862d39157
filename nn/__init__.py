"""The numba MLP core: model spec and presets, Params, kernels, optimizers, data."""

from nn.params import NeuronGroup, Params, plan_groups
from nn.spec import PRESETS, ModelSpec

__all__ = ["PRESETS", "ModelSpec", "NeuronGroup", "Params", "plan_groups"]
