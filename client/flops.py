"""How fast this machine trains, as hello reports it: measured with the real kernels.

``measure_flops`` times training steps of a probe model for ``budget_s``;
``cached_flops`` keeps a measurement in a file for a day, for the machine it
was taken on (CPU, core count, numba and crowdgrad versions). Why it is kept:
docs/client.md, "FLOP/s".
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from client.datacache import write_atomic
from nn.optim import Optimizer, OptState
from nn.spec import ModelSpec
from nn.train import train_steps

log = logging.getLogger(__name__)

#: The probe model: the digits MLP, the size of a typical task.
PROBE_WIDTHS = (64, 128, 10)
#: How long a kept measurement is used (a machine's speed is stable, its load is
#: not: a day bounds how long one taken on a busy machine undersells it).
PROBE_MAX_AGE_S = 24 * 3600.0


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


def probe_key() -> str:
    """What a kept measurement is valid for: this CPU model and core count, and
    the kernels that ran (numba's and crowdgrad's versions)."""
    import numba

    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            names = (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
            cpu = next(names, cpu)
    except OSError:
        pass
    return (
        f"{platform.machine()} | {cpu} | {os.cpu_count()} cores | numba {numba.__version__} "
        f"| crowdgrad {installed_version()} | {PROBE_WIDTHS}"
    )


def installed_version() -> str:
    """The installed crowdgrad's version (what ``crowdgrad.__version__`` says)."""
    try:
        return version("crowdgrad")
    except PackageNotFoundError:  # a source tree that is not installed
        return "0.0.0+local"


def cached_flops(
    path: str | os.PathLike[str],
    *,
    max_age_s: float = PROBE_MAX_AGE_S,
    measure: Callable[[], float] = measure_flops,
) -> tuple[float, bool]:
    """``(flop/s, kept)``: the measurement kept in the JSON file ``path`` when it is
    for this machine (``probe_key``) and younger than ``max_age_s``, else a new one
    (written back; a file that cannot be read or written costs a measurement,
    nothing more). ``kept``: it came from the file."""
    path, key, now = Path(path), probe_key(), time.time()
    try:
        kept = json.loads(path.read_text())
        flops, at = float(kept["flops"]), float(kept["at"])
        if kept["key"] == key and 0 <= now - at <= max_age_s and math.isfinite(flops) and flops > 0:
            return flops, True
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, or not ours: measure
    flops = measure()
    try:
        write_atomic(path, json.dumps({"key": key, "flops": flops, "at": now}).encode())
    except OSError as exc:
        log.warning("FLOP/s probe: cannot keep it in %s: %s", path, exc)
    return flops, False
