"""How fast this machine trains, measured once at start and reported in hello.

The coordinator sizes leases from it (deadline = slack × predicted time), so a
number measured with the real kernels on a real-sized layer beats a guess.
"""

from __future__ import annotations

import math
import time

import numpy as np

from nn.optim import Optimizer, OptState
from nn.spec import ModelSpec
from nn.train import train_steps

#: The probe model: the digits MLP, the size of a typical task.
PROBE_WIDTHS = (64, 128, 10)


def measure_flops(*, budget_s: float = 0.2, batch: int = 16, seed: int = 0) -> float:
    """Training FLOP/s of the nn core on this machine (counted as ``ModelSpec.flops_per_sample``).

    The first call compiles nothing new (kernels are cached), but it warms them
    with one step before timing doubling bursts until ``budget_s`` is spent (the
    last one cut to what is left of it).
    """
    if not budget_s > 0:
        raise ValueError(f"budget_s: must be > 0, got {budget_s!r}")
    spec = ModelSpec(widths=PROBE_WIDTHS)
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((256, PROBE_WIDTHS[0])).astype(np.float32)
    y = rng.integers(0, PROBE_WIDTHS[-1], 256)
    params = spec.init_params(seed)
    state = OptState.init(Optimizer(), spec)
    train_steps(params, state, X, y, 1, batch, rng)  # warm-up (and JIT on first use)
    steps, spent, done = 8, 0.0, 0
    while spent < budget_s:
        t0 = time.perf_counter()
        train_steps(params, state, X, y, steps, batch, rng)
        spent += time.perf_counter() - t0
        done += steps
        # Double the burst, but to no more than what the rest of the budget holds at
        # the rate so far: a plain doubling overshot it by up to 2x (client start).
        left = math.ceil((budget_s - spent) * done / max(spent, 1e-9))
        steps = max(8, min(steps * 2, left))
    return spec.flops_per_sample() * batch * done / max(spent, 1e-9)
