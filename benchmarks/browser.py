"""The browser client in headless Chromium, side by side with the numba core.

Three measurements, all in one run (docs/performance.md, "The browser client"):

* **steps** — train steps/s of the browser client's numerics inside a Chromium
  Web Worker (client/web/src/bench.js) for tiny, small and medium at batch 16,
  with the WebAssembly SIMD kernels and with the plain-JS kernels, and of the
  numba core (``nn.train.train_steps``) on the same widths, batch, loss
  (softmax_ce), optimizer (SGD) and rows, with one thread (a worker is one
  thread). Warm start for all: each contender runs 0.3 s before it is timed.
  Contenders alternate within each round; each figure is the median of the
  rounds. Ratios: ``wasm/js`` and ``wasm/numba``.
* **frames** — the volunteer page's 60 Hz frames (a requestAnimationFrame
  probe; until issue 36 the page also animated a crowd of dots each frame, since
  then it redraws its accuracy curve on new points) while its worker trains a
  CPU-bound job (digits on a [64, 512, 512, 10] MLP, 100 local steps a task)
  at CPU share 1.0 and 0.5: frame time p50/p99/max, long animation frames
  (LoAF), the worker's steps/s and its busy fraction (compute seconds per wall
  second: what the share sets; the rest of its time it waits for tasks,
  uploads, or sleeps).
* **crowd** — 8 headless tabs and no desktop client train the digits job of
  the end-to-end tests ([64, 64, 10], decentral-async, τ = 10) to 0.95
  accuracy: seconds from the first tab opening to the target.

    python benchmarks/browser.py            # table
    python benchmarks/browser.py --json     # machine-readable
    python benchmarks/browser.py --quick    # one round, shorter windows

Needs Debian's chromium (``apt-get install chromium``) and Playwright for
Python (the ``dev`` extra); nothing downloads a browser. Do not run it beside
the test suite: it measures time on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nn.threads import set_threads  # noqa: E402
from tests.browser.conftest import CHROMIUM_ARGS, chromium_path  # noqa: E402

PRESETS = ("tiny", "small", "medium")
BATCH = 16
ROWS = 2048

BENCH_PAGE = """<!doctype html><meta charset="utf-8"><title>bench</title>"""

RUN_WORKER = """
async (job) => await new Promise((done) => {
  const w = new Worker("/bench.js");
  w.onmessage = (ev) => { w.terminate(); done(ev.data); };
  w.postMessage(job);
})
"""

FRAME_PROBE = """
async ({seconds}) => {
  const longFrames = [];
  const observer = new PerformanceObserver((list) => {
    for (const e of list.getEntries()) longFrames.push(e.blockingDuration);
  });
  observer.observe({type: "long-animation-frame", buffered: false});
  const steps0 = globalThis.crowdgrad.stats.steps;
  const busy0 = globalThis.crowdgrad.stats.busySeconds;
  const t0 = performance.now();
  const frames = [];
  await new Promise((done) => {
    let last = null;
    function frame(t) {
      if (last !== null) frames.push(t - last);
      last = t;
      if (t < t0 + seconds * 1000) requestAnimationFrame(frame); else done();
    }
    requestAnimationFrame(frame);
  });
  observer.disconnect();
  const wall = (performance.now() - t0) / 1000;
  const s = globalThis.crowdgrad.stats;
  const busy = (s.busySeconds - busy0) / wall;
  return {frames, longFrames, stepsPerS: (s.steps - steps0) / wall, busy};
}
"""


def numba_steps_per_s(widths: tuple[int, ...], seconds: float) -> float:
    """The numba core on one thread: the same widths, batch, loss, optimizer."""
    from nn.optim import Optimizer, OptState
    from nn.spec import ModelSpec
    from nn.train import train_steps

    spec = ModelSpec(widths=widths, loss="softmax_ce")
    rng = np.random.default_rng(1)
    X = rng.standard_normal((ROWS, widths[0])).astype(np.float32)
    y = rng.integers(0, widths[-1], ROWS).astype(np.int32)
    params = spec.init_params(0)
    state = OptState.init(Optimizer(kind="sgd", lr=0.01), spec)
    steps = 64
    t_end = time.perf_counter() + 0.3  # warm: compiled, caches hot
    while time.perf_counter() < t_end:
        train_steps(params, state, X, y, steps, BATCH, rng)
    done, t0 = 0, time.perf_counter()
    while (t := time.perf_counter()) - t0 < seconds:
        train_steps(params, state, X, y, steps, BATCH, rng)
        done += steps
    return done / (t - t0)


def bench_steps(page: Any, rounds: int, seconds: float) -> list[dict]:
    from nn.spec import PRESETS as WIDTHS

    rows = []
    for preset in PRESETS:
        widths = WIDTHS[preset]
        got: dict[str, list[float]] = {"wasm": [], "js": [], "numba": []}
        for _ in range(rounds):
            for kernels in ("wasm", "js"):
                job = {"widths": list(widths), "batch": BATCH, "kernels": kernels,
                       "seconds": seconds, "loss": "softmax_ce"}  # fmt: skip
                r = page.evaluate(RUN_WORKER, job)
                if "error" in r:
                    raise RuntimeError(f"{preset}/{kernels}: {r['error']}")
                want = "wasm-simd" if kernels == "wasm" else "js"
                if r["kernels"] != want:
                    raise RuntimeError(f"{preset}: asked for {want}, the worker ran {r['kernels']}")
                got[kernels].append(r["stepsPerS"])
            got["numba"].append(numba_steps_per_s(widths, seconds))
        med = {k: statistics.median(v) for k, v in got.items()}
        rows.append({
            "preset": preset, "widths": list(widths), "batch": BATCH,
            "wasm_simd_steps_s": round(med["wasm"], 1), "js_steps_s": round(med["js"], 1),
            "numba_steps_s": round(med["numba"], 1),
            "wasm_over_js": round(med["wasm"] / med["js"], 2),
            "wasm_over_numba": round(med["wasm"] / med["numba"], 3),
        })  # fmt: skip
    return rows


def _quantiles(frames: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(frames, n=100)
    return round(q[49], 2), round(q[98], 2)


def bench_frames(context: Any, seconds: float) -> list[dict]:
    from tests.e2e.e2e_helpers import digits_job, running

    job = digits_job(
        model={"widths": [64, 512, 512, 10]},
        strategy={"tau": 100},
        stop={"target_accuracy": 1.0, "max_versions": 1_000_000, "max_time_s": 3600, "patience": 0},
    )
    rows = []
    with running(job) as (bg, _service, _rec):
        base = bg.url.replace("ws://", "http://").removesuffix("/ws")
        for share in (1.0, 0.5):
            page = context.new_page()
            page.goto(f"{base}/?autostart=1&share={share}")
            _wait(
                lambda p=page: (
                    (p.evaluate("globalThis.crowdgrad.stats") or {}).get("steps", 0) > 300
                )
            )
            probe = page.evaluate(FRAME_PROBE, {"seconds": seconds})
            p50, p99 = _quantiles(probe["frames"])
            rows.append({
                "share": share, "frames": len(probe["frames"]), "frame_p50_ms": p50,
                "frame_p99_ms": p99, "frame_max_ms": round(max(probe["frames"]), 2),
                "long_animation_frames": len(probe["longFrames"]),
                "worker_steps_s": round(probe["stepsPerS"], 1),
                "worker_busy": round(probe["busy"], 3),
            })  # fmt: skip
            page.close()
    return rows


def bench_crowd(context: Any, tabs: int = 8) -> dict:
    from coordinator.core import events as ev
    from tests.e2e.e2e_helpers import digits_job, running

    job = digits_job(stop={"max_time_s": 600})
    with running(job) as (bg, _service, rec):
        url = bg.url.replace("ws://", "http://").removesuffix("/ws") + "/?autostart=1"
        t0 = time.monotonic()
        pages = []
        for _ in range(tabs):
            p = context.new_page()
            p.goto(url)
            pages.append(p)
        rec.wait_for(lambda: bool(rec.of(ev.JobFinished)), timeout=600)
        elapsed = time.monotonic() - t0
        fin = rec.of(ev.JobFinished)
        web = {j.client_id for j in rec.of(ev.ClientJoined)}
        accepted = len(rec.of(ev.ResultAccepted))
        for p in pages:
            p.close()
    return {
        "tabs": tabs,
        "desktop_clients": 0,
        "clients_joined": len(web),
        "reason": fin[0].reason if fin else "not finished",
        "accuracy": round(fin[0].accuracy, 4) if fin and fin[0].accuracy is not None else None,
        "versions": fin[0].version if fin else None,
        "results_accepted": accepted,
        "seconds_to_target": round(elapsed, 2),
    }


def _wait(pred: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError("the page did not start training")
        time.sleep(0.2)


def run(rounds: int, seconds: float, frame_seconds: float) -> dict:
    from playwright.sync_api import sync_playwright

    from client import WEB_ROOT
    from tests.e2e.e2e_helpers import digits_job, running

    set_threads(1)
    path = chromium_path()
    if path is None:
        raise SystemExit("benchmarks/browser.py: no chromium (Debian: apt-get install chromium)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context()
        # The bench worker is served beside the page by a coordinator's static route.
        with running(digits_job()) as (bg, _s, _r):
            page = context.new_page()
            page.goto(bg.url.replace("ws://", "http://").removesuffix("/ws") + "/style.css")
            steps = bench_steps(page, rounds, seconds)
            page.close()
        frames = bench_frames(context, frame_seconds)
        crowd = bench_crowd(context)
        version = browser.version
        browser.close()
    return {
        "chromium": version,
        "web_root": str(WEB_ROOT.relative_to(ROOT)),
        "steps": steps,
        "frames": frames,
        "crowd": crowd,
    }


def _row(cells: list[Any], widths: list[int]) -> str:
    return " ".join(
        f"{c:>{w}}" if i else f"{c:<{w}}"
        for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    )


def print_table(res: dict) -> None:
    print(f"Chromium {res['chromium']} (headless), batch {BATCH}, SGD, softmax_ce, one thread each")
    w = [8, 11, 10, 10, 8, 11]
    print(_row(["preset", "wasm-simd", "plain js", "numba", "wasm/js", "wasm/numba"], w))
    for r in res["steps"]:
        cells = [r["preset"], f"{r['wasm_simd_steps_s']:,.0f}", f"{r['js_steps_s']:,.0f}",
                 f"{r['numba_steps_s']:,.0f}", f"{r['wasm_over_js']:.2f}x",
                 f"{r['wasm_over_numba']:.3f}x"]  # fmt: skip
        print(_row(cells, w))
    print("\nframes of the animating page while its worker trains ([64,512,512,10], tau 100)")
    w = [5, 7, 7, 7, 7, 5, 8, 6]
    print(_row(["share", "frames", "p50 ms", "p99 ms", "max ms", "LoAF", "steps/s", "busy"], w))
    for r in res["frames"]:
        cells = [r["share"], r["frames"], r["frame_p50_ms"], r["frame_p99_ms"], r["frame_max_ms"],
                 r["long_animation_frames"], f"{r['worker_steps_s']:,.0f}",
                 f"{r['worker_busy']:.2f}"]  # fmt: skip
        print(_row(cells, w))
    c = res["crowd"]
    print(
        f"\n{c['tabs']} tabs, no desktop client, digits to 0.95: {c['reason']} at accuracy "
        f"{c['accuracy']} after {c['seconds_to_target']} s ({c['results_accepted']} results)"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--quick", action="store_true", help="one round, shorter windows")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per contender (default 3)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds: must be >= 1")
    rounds, seconds, frame_s = (1, 0.5, 3.0) if args.quick else (args.rounds, 1.5, 8.0)
    res = run(rounds, seconds, frame_s)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print_table(res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
