"""A headless 60 Hz game loop that lends part of each frame to crowdgrad.

Each frame: the game's own work (``--work-ms`` of busy CPU, standing in for
physics and drawing), then ``client.step(budget)`` with ``--budget-ms``, then a
sleep to the next tick. A late frame starts the next one at once (no catch-up
burst). At the end it prints the frame times (start to start: what a player
sees) and what the client did::

    .venv/bin/python examples/ingame_loop.py --demo                    # own coordinator
    .venv/bin/python examples/ingame_loop.py ws://HOST:8765/ws --budget-ms 4
    .venv/bin/python examples/ingame_loop.py --seconds 10              # the loop alone

``benchmarks/frame_budget.py`` runs this file as its game process (``--json``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from client.ingame import InGameClient  # noqa: E402

#: A frame slower than this is a visible stutter at 60 Hz (the issue's threshold).
STUTTER_MS = 20.0


def busy(seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
    """The game's own work: the CPU held for ``seconds`` (the GIL too)."""
    end = clock() + seconds
    while clock() < end:
        pass


def frame_stats(intervals_s: list[float]) -> dict[str, float | int]:
    """p50 / p99 / max of frame times in ms, and how many exceeded ``STUTTER_MS``."""
    ms = sorted(x * 1000.0 for x in intervals_s)
    if not ms:
        return {"frames": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0, "over_20ms": 0}

    def q(p: float) -> float:
        return ms[min(len(ms) - 1, int(p * len(ms)))]

    return {
        "frames": len(ms),
        "p50_ms": round(q(0.50), 2),
        "p99_ms": round(q(0.99), 2),
        "max_ms": round(ms[-1], 2),
        "over_20ms": sum(1 for x in ms if x > STUTTER_MS),
    }


def game_loop(
    *,
    hz: float = 60.0,
    work: Callable[[], None] = lambda: None,
    client: InGameClient | None = None,
    budget_s: float = 0.004,
    frames: int = 600,
    warmup_frames: int = 0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Run ``warmup_frames`` then ``frames`` measured frames; returns the measured
    frame intervals and ``client.step`` times (s), and the clock at the first and
    last measured frame."""
    period = 1.0 / hz
    intervals: list[float] = []
    steps: list[float] = []
    t_first = t_last = 0.0
    steps0 = measured_steps = 0
    prev: float | None = None
    next_tick = clock()
    for i in range(warmup_frames + frames + 1):
        start = clock()
        if i == warmup_frames:
            t_first = start
            steps0 = client.stats.steps if client is not None else 0
        elif i > warmup_frames and prev is not None:
            intervals.append(start - prev)
        prev = start
        if i == warmup_frames + frames:
            t_last = start
            measured_steps = client.stats.steps - steps0 if client is not None else 0
            break
        work()
        if client is not None:
            t0 = clock()
            client.step(budget_s)
            if i >= warmup_frames:
                steps.append(clock() - t0)
        next_tick += period
        delay = next_tick - clock()
        if delay > 0:
            sleep(delay)
        else:
            next_tick = clock()  # late: start the next frame now, do not catch up
    return {
        "intervals": intervals,
        "steps": steps,
        "t0": t_first,
        "t1": t_last,
        "client_steps": measured_steps,
    }


@contextlib.contextmanager
def demo_coordinator() -> Iterator[str]:
    """A local coordinator (its own threads, not the game's) on a digits job."""
    from coordinator.core.config import parse_job
    from coordinator.http.server import CrowdServer
    from coordinator.http.serving import BackgroundServer
    from coordinator.runtime.service import CoreService

    job = parse_job(
        {
            "model": {"widths": [64, 128, 10]},
            "strategy": {"name": "decentral-async", "tau": 20, "lr": 0.1},
            "stop": {"target_accuracy": None, "max_versions": 1_000_000},
        }
    )
    with BackgroundServer(CrowdServer(CoreService(job))) as bg:
        yield bg.url


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("url", nargs="?", help="coordinator ws:// or wss:// URL (none: the loop alone)")
    p.add_argument("--ca", metavar="PEM", help="for wss://: trust these CA certificates")
    p.add_argument("--demo", action="store_true", help="start a local coordinator and join it")
    p.add_argument("--hz", type=float, default=60.0, help="frame rate (60)")
    p.add_argument("--work-ms", type=float, default=6.0, help="the game's work per frame (6)")
    p.add_argument("--budget-ms", type=float, default=4.0, help="crowdgrad's share (4)")
    p.add_argument("--seconds", type=float, default=10.0, help="measured time (10)")
    p.add_argument("--warmup-s", type=float, default=2.0, help="frames not measured (2)")
    p.add_argument("--name", default="ingame-example")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(demo_coordinator()) if args.demo else args.url
        client = None
        if url is not None:
            client = InGameClient(url, name=args.name, ca=args.ca)
            # The loading screen: kernels loaded, FLOP/s measured, one compute thread.
            client.warm_up()
        work_s = args.work_ms / 1000.0
        run = game_loop(
            hz=args.hz,
            work=lambda: busy(work_s),
            client=client,
            budget_s=args.budget_ms / 1000.0,
            frames=round(args.seconds * args.hz),
            warmup_frames=round(args.warmup_s * args.hz),
        )
        out: dict[str, Any] = {
            "hz": args.hz,
            "work_ms": args.work_ms,
            "budget_ms": args.budget_ms if client is not None else None,
            "t0": run["t0"],
            "t1": run["t1"],
            **frame_stats(run["intervals"]),
        }
        if client is not None:
            s = client.stats
            took = sorted(run["steps"])
            out["client"] = {
                "step_p50_ms": round(took[len(took) // 2] * 1000.0, 3),
                "step_p99_ms": round(took[int(0.99 * len(took))] * 1000.0, 3),
                "step_max_ms": round(took[-1] * 1000.0, 3),
                "steps_per_s": round(run["client_steps"] / (run["t1"] - run["t0"]), 1),
                "results": s.results,
                "steps": s.steps,
                "compute_s": round(s.compute_s, 3),
                "overruns": s.overruns,
                "longest_step_ms": round(s.longest_step_s * 1000.0, 3),
                "connects": s.connects,
            }
            client.stop()
            deadline = time.monotonic() + 5.0
            while client.finished is None and time.monotonic() < deadline:
                client.step(args.budget_ms / 1000.0)
                time.sleep(1.0 / args.hz)
            client.close()
    if args.json:
        print(json.dumps(out))  # noqa: T201 - a command line prints
    else:
        print(  # noqa: T201
            f"{out['frames']} frames: p50 {out['p50_ms']} ms, p99 {out['p99_ms']} ms, "
            f"max {out['max_ms']} ms, {out['over_20ms']} over {STUTTER_MS:.0f} ms"
        )
        if "client" in out:
            print(f"client: {out['client']}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
