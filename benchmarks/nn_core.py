"""Train-step throughput: crowdgrad's numba core vs JAX, PyTorch and the numpy reference.

Every contender trains the same widths (ReLU hidden layers, MSE, plain SGD,
float32) at the same batch size with the same thread count (2 by default:
numba, every BLAS library loaded (threadpoolctl), torch's intra-op pool and
XLA's Eigen pool). The like-for-like peer is ``jax``: the whole loop of SGD
steps compiled as one call (``jax.jit`` over ``jax.lax.scan``), as crowdgrad's
``train_loop`` is. ``torch`` is the usual Python-driven autograd step, one
call per step, and ``torch-manual`` a hand-written forward/backward with no
autograd (``torch.no_grad``, ``addmm``), which shows how much of torch's
figure is Python and autograd overhead. Anchors run at their own defaults:
they are imported before crowdgrad bounds GNU OpenMP's spin (nn.threads), so
torch's bundled libgomp keeps its default wait policy. Contenders alternate
within one run, several rounds each, and each figure is the median of its
rounds, so a noisy neighbour hits all of them alike; the ratios are the result.
The machine's float32 GEMM rate (numpy matmul) is the anchor for the
GEMM-bound rate of a step, ``6 · weights · batch`` FLOPs.

"crowdgrad" splits big layers into neuron groups, one per numba thread, each
on single-threaded sgemm; "whole" is the same core with one numba thread and
multi-threaded BLAS on whole layers, for comparison.

    python benchmarks/nn_core.py              # table
    python benchmarks/nn_core.py --json       # {"gemm_gflops": x, "rows": [...]}
    python benchmarks/nn_core.py --quick      # fewer rounds, for a smoke run
    python benchmarks/nn_core.py --shapes     # one-core sgemm rate of each step GEMM
    python benchmarks/nn_core.py --phases large:128   # where one step's time goes

torch and jax are the ``bench`` extra (``pip install -e '.[bench]'``); without
them their columns are empty.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

# XLA reads its thread flags when jax first initialises: --threads is applied
# to it here, before anything imports jax.
if "--threads" in sys.argv[:-1]:
    _n = sys.argv[sys.argv.index("--threads") + 1]
    if _n == "1":
        os.environ.setdefault(
            "XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        )

# The anchors load first, at their own defaults (torch's bundled libgomp reads
# the OpenMP wait policy once, when it loads); then crowdgrad bounds the spin of
# the libgomp numba uses (nn.threads), as the library does for itself.
with contextlib.suppress(ImportError):
    import torch  # noqa: F401
with contextlib.suppress(ImportError):
    import jax  # noqa: F401

from nn.threads import bound_omp_spin

bound_omp_spin()

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONFIGS = [
    ("tiny", 16),
    ("tiny", 128),
    ("small", 16),
    ("small", 128),
    ("medium", 16),
    ("medium", 128),
    ("large", 16),
    ("large", 128),
    ("huge", 16),
]
N_ROWS = 2048  # rows of the synthetic dataset each contender samples from
#: Pause before each measurement: OpenBLAS pool threads busy-wait ~0.1 s after a
#: call (2^28 cycles), so without it a contender runs against the previous one's
#: spinning threads, and the order of the contenders decides the result.
SETTLE_S = 0.2


@functools.cache
def _square(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, n), dtype=np.float32), np.empty((n, n), np.float32)


def gemm_gflops(n: int = 2048, reps: int = 5) -> float:
    """Best-of-``reps`` float32 matmul rate (GFLOP/s) through numpy's BLAS."""
    a, out = _square(n)
    np.matmul(a, a, out=out)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        np.matmul(a, a, out=out)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def step_phases(preset: str, batch: int, reps: int = 40) -> tuple[str, list[tuple[str, float]]]:
    """Median wall ms of each piece of one SGD step, the kernels called one by one.

    Runs the design ``train_steps`` picks for this batch (neuron groups or whole
    layers on multi-threaded BLAS). Ends with the whole compiled step
    (``train_loop``) for comparison: Python between the calls adds a few µs each.
    """
    from threadpoolctl import threadpool_limits

    from nn import kernels as K
    from nn.blas import gemm
    from nn.spec import PRESETS, ModelSpec
    from nn.train import group_threads, layout_of

    spec = ModelSpec(widths=PRESETS[preset], loss="mse")
    lay, data = layout_of(spec), spec.init_params(0).data
    rng = np.random.default_rng(1)
    X = rng.standard_normal((N_ROWS, spec.widths[0]), dtype=np.float32)
    T = rng.standard_normal((N_ROWS, spec.widths[-1]), dtype=np.float32)
    labels, idx = np.zeros(0, np.int64), rng.permutation(N_ROWS)[:batch].astype(np.int64)
    aoff, abuf, D1, D2, Xb = K._workspace(lay.shapes, batch, data)
    parts = group_threads(lay, batch)
    part = np.empty(max(parts - 1, 0) * D1.shape[0], np.float32)
    T1 = np.empty(D1.shape[0], np.float32)  # weight_product_'s scratch, as in train_loop
    lr, L, times = 1e-6, lay.shapes.shape[0], {}

    def layer(l: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
        (o, i), (w0, b0), fm = lay.shapes[l], lay.offs[l], l < L - 1
        Z = abuf[aoff[l] : aoff[l] + batch * o].reshape((o, batch) if fm else (batch, o))
        return data[w0 : w0 + o * i].reshape(o, i), data[b0 : b0 + o], Z, fm

    def timed(name: str, fn: Callable, *a) -> None:
        t = time.perf_counter()
        fn(*a)
        times.setdefault(name, []).append(time.perf_counter() - t)

    def step() -> None:
        timed("gather", K._gather, X, idx, Xb)
        prev = Xb
        for l in range(L):
            W, b, Z, fm = layer(l)
            n = K.split_layer(batch, W.shape[0], W.shape[1], parts)
            if n > 1:
                timed(f"L{l} forward (groups)", K.forward_groups_,
                      prev, l > 0, W, b, Z, fm, lay.acts[l], n)  # fmt: skip
            else:
                gemm_args = (False, l == 0, 1.0, W, prev) if fm else (l > 0, True, 1.0, prev, W)
                timed(f"L{l} forward gemm", gemm, *gemm_args, 0.0, Z)
                timed(f"L{l} bias+act", K.bias_act_, Z, b, lay.acts[l], fm)
            prev = Z
        D = D1[: prev.size].reshape(prev.shape)
        timed("loss", K.loss_grad_, prev, lay.loss, T, labels, idx, D)
        cur, other = D1, D2
        for l in range(L - 1, -1, -1):
            W, b, A, fm = layer(l)
            (o, i), n = W.shape, K.split_layer(batch, W.shape[0], W.shape[1], parts)
            dZ = cur[: batch * o].reshape(A.shape)
            prv = Xb if l == 0 else layer(l - 1)[2]
            dA = other[: batch * i if l else 0].reshape(i if l else 0, batch)
            if n > 1:
                args = (dZ, fm, A, lay.acts[l], prv, l > 0, W, dA, part, W, b, K.MODE_SGD, lr, n)
                timed(f"L{l} backward (groups)", K.backward_groups_, *args)
            else:
                delta_args = (dZ, A, lay.acts[l], b, K.MODE_SGD, lr, fm)
                timed(f"L{l} act' + bias step", K.delta_bias_, *delta_args)
                if l:
                    timed(f"L{l} dA gemm", gemm, True, not fm, 1.0, W, dZ, 0.0, dA)
                timed(f"L{l} update gemm", K.weight_product_, dZ, fm, prv, l > 0, -lr, 1.0, W, T1)
            cur, other = other, cur

    steps = 10
    bidx, losses, e = np.tile(idx, steps), np.empty(steps), np.zeros(0, np.float32)
    loop_args = (data, lay.shapes, lay.offs, lay.acts, lay.loss, X, T, labels, bidx, batch,
                 0, lr, 0.0, False, 0.9, 0.999, 1e-8, 0, e, e, e, losses, parts)  # fmt: skip
    with threadpool_limits(limits=1) if parts > 1 else contextlib.nullcontext():
        for _ in range(3):
            step()
        times.clear()
        for _ in range(reps):
            step()
        K.train_loop(*loop_args)
        for _ in range(reps):
            timed("whole step (train_loop)", K.train_loop, *loop_args)
    out = [(k, 1e3 * statistics.median(v)) for k, v in times.items()]
    out[-1] = (out[-1][0], out[-1][1] / steps)
    return ("neuron groups" if parts > 1 else "whole layers"), out


def shape_rates(reps: int = 15) -> list[tuple[str, float]]:
    """One-thread sgemm GFLOP/s of the GEMMs in a step of a 1024² and a 4096² layer.

    Timed in thread CPU time, best of ``reps``: on a shared machine that is close
    to the unloaded rate, where wall-clock rates of parallel code are not.
    """
    from threadpoolctl import threadpool_limits

    from nn.blas import gemm

    rng = np.random.default_rng(0)

    def rate(ta: bool, tb: bool, m: int, n: int, k: int) -> float:
        A = rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
        B = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
        C = np.zeros((m, n), np.float32)
        gemm(ta, tb, 1.0, A, B, 0.0, C)
        best = float("inf")
        for _ in range(reps):
            t = time.thread_time()
            gemm(ta, tb, 1.0, A, B, 1.0, C)
            best = min(best, time.thread_time() - t)
        return 2 * m * n * k / best / 1e9

    out = []
    with threadpool_limits(limits=1):
        out.append(("square 2048³", rate(False, False, 2048, 2048, 2048)))
        for batch, rows, cols in [(16, 1024, 1024), (16, 512, 1024), (128, 1024, 1024),
                                  (128, 512, 1024), (16, 2048, 4096)]:  # fmt: skip
            tag = f"batch {batch}, {rows} rows x {cols}"
            out.append((f"{tag}: forward  Z = A·Wᵀ", rate(False, True, batch, rows, cols)))
            out.append((f"{tag}: backward dA = dZ·W", rate(False, False, batch, cols, rows)))
            out.append((f"{tag}: update   W -= dZᵀ·A", rate(True, False, rows, cols, batch)))
    return out


class Contender:
    """One implementation: ``run(steps)`` trains that many steps."""

    def __init__(self, name: str, run: Callable[[int], None]) -> None:
        self.name = name
        self.run = run
        self.rates: list[float] = []
        self.steps = 1

    def calibrate(self, target_s: float) -> None:
        """Find the step count that takes about ``target_s``. Each count runs twice
        and the second is timed, and the chosen count runs once before any
        measurement: jax compiles a program per scan length, and that compile
        must count in neither the calibration nor the rate."""
        steps = 1
        while True:
            self.run(steps)
            t = time.perf_counter()
            self.run(steps)
            dt = time.perf_counter() - t
            if dt >= target_s / 4 or steps >= 1 << 16:
                break
            steps *= 4
        self.steps = max(1, int(steps * target_s / max(dt, 1e-9)))
        self.run(self.steps)

    def measure(self) -> None:
        time.sleep(SETTLE_S)
        t = time.perf_counter()
        self.run(self.steps)
        self.rates.append(self.steps / (time.perf_counter() - t))

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)


def crowdgrad_contender(widths, X, Y, batch: int, *, whole: bool = False) -> Contender:
    import numba

    from nn.optim import Optimizer, OptState
    from nn.spec import ModelSpec
    from nn.train import train_steps

    spec = ModelSpec(widths=widths, loss="mse")
    params = spec.init_params(0)
    state = OptState.init(Optimizer(kind="sgd", lr=1e-3), spec)
    rng = np.random.default_rng(0)

    def run(steps: int) -> None:
        if not whole:
            train_steps(params, state, X, Y, steps, batch, rng)
            return
        before = numba.get_num_threads()
        numba.set_num_threads(1)  # no neuron groups: BLAS keeps its thread count
        try:
            train_steps(params, state, X, Y, steps, batch, rng)
        finally:
            numba.set_num_threads(before)

    return Contender("whole" if whole else "crowdgrad", run)


def numpy_contender(widths, X, Y, batch: int) -> Contender:
    from nn import reference as nn_reference
    from nn.spec import ModelSpec

    params = ModelSpec(widths=widths, loss="mse").init_params(0)
    Ws = [W.copy() for W in params.W]
    bs = [b.copy() for b in params.b]
    return Contender("numpy", lambda s: nn_reference.train_steps_per_second(Ws, bs, X, Y, batch, s))


def torch_contender(widths, X, Y, batch: int) -> Contender | None:
    try:
        import torch
    except ImportError:
        return None
    layers: list = []
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        layers.append(torch.nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.MSELoss()
    Xt, Yt = torch.from_numpy(X), torch.from_numpy(Y)
    n = len(X) - batch + 1

    def run(steps: int) -> None:
        for s in range(steps):
            r0 = (s * batch) % n
            opt.zero_grad()
            loss = loss_fn(model(Xt[r0 : r0 + batch]), Yt[r0 : r0 + batch])
            loss.backward()
            opt.step()

    return Contender("torch", run)


def torch_manual_contender(widths, X, Y, batch: int) -> Contender | None:
    """The same step written out by hand: no autograd, no optimizer object."""
    try:
        import torch
    except ImportError:
        return None
    from nn.spec import ModelSpec

    params = ModelSpec(widths=widths, loss="mse").init_params(0)
    Ws = [torch.from_numpy(W.copy()) for W in params.W]
    bs = [torch.from_numpy(b.copy()) for b in params.b]
    Xt, Yt = torch.from_numpy(X), torch.from_numpy(Y)
    n, lr, L = len(X) - batch + 1, 1e-3, len(Ws)

    @torch.no_grad()
    def run(steps: int) -> None:
        for s in range(steps):
            r0 = (s * batch) % n
            acts = [Xt[r0 : r0 + batch]]
            for l in range(L):
                z = torch.addmm(bs[l], acts[-1], Ws[l].t())
                acts.append(z.relu_() if l < L - 1 else z)
            d = (acts[-1] - Yt[r0 : r0 + batch]).mul_(2.0 / acts[-1].numel())
            for l in range(L - 1, -1, -1):
                if l < L - 1:
                    d.mul_(acts[l + 1] > 0)
                nxt = d @ Ws[l] if l else None
                Ws[l].addmm_(d.t(), acts[l], alpha=-lr)
                bs[l].sub_(d.sum(0), alpha=lr)
                d = nxt

    return Contender("torch-manual", run)


def jax_contender(widths, X, Y, batch: int) -> Contender | None:
    """The whole loop as one XLA program: ``jit`` over ``lax.scan`` of SGD steps."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    from nn.spec import ModelSpec

    spec = ModelSpec(widths=widths, loss="mse").init_params(0)
    params = [(jnp.asarray(W), jnp.asarray(b)) for W, b in zip(spec.W, spec.b, strict=True)]
    Xj, Yj = jnp.asarray(X), jnp.asarray(Y)
    n, lr = len(X) - batch + 1, 1e-3

    def loss(p, x, y):
        h = x
        for i, (W, b) in enumerate(p):
            h = h @ W.T + b
            if i < len(p) - 1:
                h = jax.nn.relu(h)
        return jnp.mean((h - y) ** 2)

    grad = jax.grad(loss)

    @functools.partial(jax.jit, donate_argnums=0)
    def loop(p, starts):
        def body(p, r0):
            x = jax.lax.dynamic_slice_in_dim(Xj, r0, batch)
            y = jax.lax.dynamic_slice_in_dim(Yj, r0, batch)
            g = grad(p, x, y)
            return jax.tree.map(lambda a, da: a - lr * da, p, g), None

        return jax.lax.scan(body, p, starts)[0]

    state = {"p": params}

    def run(steps: int) -> None:
        starts = jnp.asarray((np.arange(steps) * batch) % n, dtype=jnp.int32)
        state["p"] = jax.block_until_ready(loop(state["p"], starts))

    return Contender("jax", run)


def bench_config(preset: str, batch: int, rounds: int, target_s: float) -> dict:
    from nn.spec import PRESETS, ModelSpec

    widths = PRESETS[preset]
    rng = np.random.default_rng(1)
    X = rng.standard_normal((N_ROWS, widths[0]), dtype=np.float32)
    Y = rng.standard_normal((N_ROWS, widths[-1]), dtype=np.float32)
    contenders = [
        c
        for c in (
            crowdgrad_contender(widths, X, Y, batch),
            crowdgrad_contender(widths, X, Y, batch, whole=True),
            jax_contender(widths, X, Y, batch),
            torch_contender(widths, X, Y, batch),
            torch_manual_contender(widths, X, Y, batch),
            numpy_contender(widths, X, Y, batch),
        )
        if c is not None
    ]
    for c in contenders:
        c.calibrate(target_s)
    anchor = []
    for _ in range(rounds):
        time.sleep(SETTLE_S)
        anchor.append(gemm_gflops(reps=2))
        for c in contenders:
            c.measure()
    rates = {c.name: c.rate for c in contenders}
    gflops = statistics.median(anchor)
    flops = ModelSpec(widths=widths).flops_per_sample() * batch
    cg, th, jx = rates["crowdgrad"], rates.get("torch"), rates.get("jax")
    tm = rates.get("torch-manual")
    return {
        "preset": preset,
        "batch": batch,
        "gemm_gflops": gflops,
        "crowdgrad_steps_s": cg,
        "whole_steps_s": rates["whole"],
        "jax_steps_s": jx,
        "torch_steps_s": th,
        "torch_manual_steps_s": tm,
        "numpy_steps_s": rates["numpy"],
        "ratio_vs_jax": cg / jx if jx else None,
        "ratio_vs_torch": cg / th if th else None,
        "ratio_vs_torch_manual": cg / tm if tm else None,
        "crowdgrad_gemm_fraction": cg * flops / (gflops * 1e9),
        "whole_gemm_fraction": rates["whole"] * flops / (gflops * 1e9),
        "torch_gemm_fraction": th * flops / (gflops * 1e9) if th else None,
        "jax_gemm_fraction": jx * flops / (gflops * 1e9) if jx else None,
    }


def set_threads(n: int) -> None:
    import numba
    from threadpoolctl import threadpool_limits

    import nn.blas  # noqa: F401  scipy's OpenBLAS must be loaded to be limited

    numba.set_num_threads(n)
    threadpool_limits(limits=n)
    try:
        import torch

        torch.set_num_threads(n)
    except ImportError:
        pass


def print_phases(spec_arg: str) -> None:
    from nn.spec import PRESETS, ModelSpec

    preset, _, batch = spec_arg.partition(":")
    batch = int(batch or 128)
    design, phases = step_phases(preset, batch)
    flops = ModelSpec(widths=PRESETS[preset]).flops_per_sample() * batch
    gflops = gemm_gflops()
    print(f"{preset}/{batch}, {design}: median ms per piece; float32 GEMM {gflops:.1f} GFLOP/s")
    total = sum(ms for name, ms in phases[:-1])
    for name, ms in phases[:-1]:
        print(f"  {name:26} {ms:8.3f} ms  {100 * ms / total:5.1f} %")
    print(f"  {'sum of pieces':26} {total:8.3f} ms")
    print(f"  {phases[-1][0]:26} {phases[-1][1]:8.3f} ms")
    rate = flops / phases[-1][1] / 1e6  # GFLOP/s: the step is in ms
    print(f"  compiled step: {rate:.1f} GFLOP/s = {100 * rate / gflops:.1f} % of the GEMM rate")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--threads", type=int, default=2, help="threads for every contender")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds per config")
    ap.add_argument("--target", type=float, default=0.15, help="seconds per round")
    ap.add_argument("--quick", action="store_true", help="2 rounds of 0.05 s")
    ap.add_argument("--only", help="comma-separated presets to run")
    ap.add_argument("--shapes", action="store_true", help="one-core sgemm rate per GEMM shape")
    ap.add_argument("--phases", metavar="PRESET:BATCH", help="time the pieces of one step")
    args = ap.parse_args(argv)
    if args.shapes:
        for name, r in shape_rates():
            print(f"{name:45} {r:6.1f} GFLOP/s (1 thread, CPU time)")
        return 0
    if args.quick:
        args.rounds, args.target = 2, 0.05
    set_threads(args.threads)
    if args.phases:
        print_phases(args.phases)
        return 0
    only = set(args.only.split(",")) if args.only else None
    rows = [
        bench_config(p, b, args.rounds, args.target)
        for p, b in CONFIGS
        if only is None or p in only
    ]
    if args.json:
        print(json.dumps({"threads": args.threads, "rows": rows}))
        return 0
    print(f"threads: {args.threads}; train steps/s, median of {args.rounds} rounds; x jax =")
    print("crowdgrad / jax (the compiled-loop peer); % = share of the GEMM-bound rate,")
    print("6·params·batch FLOPs at the 2048² float32 matmul rate (GEMM column)")
    cols = ("crowdgrad", "whole", "jax", "torch", "torch-man", "numpy")
    head = "".join(f"{c:>10}" for c in cols)
    print(f"{'preset':8} {'batch':>5}{head} {'x jax':>6} {'x torch':>7} {'GEMM':>6} "
          f"{'cg %':>6} {'jax %':>6}")  # fmt: skip
    nan = float("nan")
    keys = ("crowdgrad", "whole", "jax", "torch", "torch_manual", "numpy")
    for r in rows:
        vals = "".join(f"{r[k + '_steps_s'] or nan:10.1f}" for k in keys)
        print(
            f"{r['preset']:8} {r['batch']:5d}{vals} "
            f"{r['ratio_vs_jax'] or nan:6.2f} {r['ratio_vs_torch'] or nan:7.2f} "
            f"{r['gemm_gflops']:6.0f} {100 * r['crowdgrad_gemm_fraction']:5.1f}% "
            f"{100 * (r['jax_gemm_fraction'] or nan):5.1f}%"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
