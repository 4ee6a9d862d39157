"""A soak over real sockets: real clients through a fault-injecting proxy, kill -9s.

N real ``crowdgrad client`` processes join a real ``crowdgrad coordinator
--store FILE`` through testkit/faultproxy.py (per-connection latency and
jitter, drops, resets, blackholes, partitions; seeded). Clients are SIGKILLed
and restarted at random, the coordinator is SIGKILLed and restarted every few
minutes. Reported: acknowledged results lost (must be 0: every ack the proxy
read from a coordinator is checked, after each kill, against what the restart
restores), each kill's recovery, clients that did not come back, the
coordinator's RSS over time, accuracy over the run, the faults injected
(testkit/soak.py, testkit/soakreport.py; docs/performance.md, "The soak").
Exit status 1 when the verdict is not ok.

    .venv/bin/python benchmarks/soak.py --minutes 30 --json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.append(str(_HERE.parent))  # testkit: in the checkout, not the wheel

from testkit.faultproxy import FaultPlan  # noqa: E402
from testkit.soak import SoakConfig, run_soak  # noqa: E402


def _pair(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(",")
    return float(lo), float(hi or lo)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seed", type=int, default=34)
    ap.add_argument(
        "--kill-every",
        type=_pair,
        default=(150.0, 270.0),
        metavar="MIN,MAX",
        help="seconds between coordinator kill -9s, drawn uniformly",
    )
    ap.add_argument(
        "--client-kill-every",
        type=float,
        default=180.0,
        metavar="S",
        help="mean seconds between one client's kill -9s (0: never)",
    )
    ap.add_argument(
        "--latency",
        type=_pair,
        default=(0.005, 0.08),
        metavar="MIN,MAX",
        help="one-way latency of a connection, s, drawn per connection",
    )
    ap.add_argument("--jitter", type=float, default=0.02, help="extra delay per chunk, s")
    ap.add_argument(
        "--drop-after",
        type=float,
        default=240.0,
        metavar="S",
        help="mean connection life before a FIN drop (0: none)",
    )
    ap.add_argument(
        "--reset-after",
        type=float,
        default=300.0,
        metavar="S",
        help="mean connection life before an RST (0: none)",
    )
    ap.add_argument(
        "--blackhole-after",
        type=float,
        default=1800.0,
        metavar="S",
        help="mean connection life before it goes silent (0: none)",
    )
    ap.add_argument("--bandwidth", type=float, default=0.0, help="bytes/s a connection (0: any)")
    ap.add_argument(
        "--partition-every",
        type=float,
        default=240.0,
        metavar="S",
        help="mean seconds between partitions (0: none)",
    )
    ap.add_argument("--partition", type=_pair, default=(2.0, 6.0), metavar="MIN,MAX")
    ap.add_argument("--rejoin-deadline", type=float, default=120.0)
    ap.add_argument("--coordinator-args", default="--widths 64,128,10 --checkpoint-every 20")
    ap.add_argument("--client-args", default="--flops 1e9 --cpu-share 0.5 --priority normal")
    ap.add_argument("--keep", type=Path, help="keep the run's folder (logs, store) here")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.minutes <= 0 or args.clients < 1:
        ap.error("--minutes must be > 0 and --clients >= 1")

    def some(x: float) -> float | None:
        return x if x > 0 else None

    faults = FaultPlan(
        latency_s=args.latency, jitter_s=args.jitter,
        drop_after_s=some(args.drop_after), reset_after_s=some(args.reset_after),
        blackhole_after_s=some(args.blackhole_after), bandwidth=some(args.bandwidth),
        partition_every_s=some(args.partition_every), partition_s=args.partition,
    )  # fmt: skip
    cfg = SoakConfig(
        duration_s=args.minutes * 60, clients=args.clients, seed=args.seed, faults=faults,
        coordinator_kill_every_s=args.kill_every,
        client_kill_every_s=some(args.client_kill_every),
        rejoin_deadline_s=args.rejoin_deadline,
        coordinator_args=tuple(args.coordinator_args.split()),
        client_args=tuple(args.client_args.split()),
    )  # fmt: skip
    say = (lambda s: print(s, file=sys.stderr, flush=True)) if args.json else print
    if args.keep is not None:
        report = run_soak(cfg, args.keep, say)
    else:
        with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
            report = run_soak(cfg, Path(tmp), say)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(report.table())
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main()
