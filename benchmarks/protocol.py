"""Encode/decode throughput of the large preset's Params as protocol chunks.

Encode: Params -> list of frames (``protocol.chunking.encode_params``).
Decode: frames -> Params (``decode`` + ``Reassembler.add``, into a reused buffer).
Anchor: a memcpy (``np.copyto``) of the same bytes in the same run. Each figure
is the best of ``--repeat`` runs, since the machine is shared.

    python benchmarks/protocol.py [--preset large] [--profile roblox] [--json]
                                  [--no-tune-malloc]

The product's entry points call ``crowdgrad.process.tune_malloc`` and so does
this benchmark; with ``--no-tune-malloc`` encode is dominated by the kernel faulting in fresh
pages for each multi-MB frame, not by the codec; with zlib's crc32 (no ``isal``
installed) the checksum is the next bottleneck (see protocol/checksum.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

# This script is named like the package it measures: keep its own folder off
# sys.path, or ``import protocol`` would import this file.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import numpy as np  # noqa: E402

from crowdgrad.process import tune_malloc  # noqa: E402
from nn.params import Params  # noqa: E402
from nn.spec import ModelSpec  # noqa: E402
from protocol.checksum import BACKEND  # noqa: E402
from protocol.chunking import encode_params  # noqa: E402
from protocol.limits import profile  # noqa: E402
from protocol.messages import decode  # noqa: E402
from protocol.reassembly import Reassembler  # noqa: E402


def best_seconds(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm caches and page tables
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="large")
    ap.add_argument("--profile", default="roblox", help="link profile giving max_message_bytes")
    ap.add_argument("--max-message-bytes", type=int, default=None, help="overrides --profile")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json", action="store_true", help="print only the three figures as JSON")
    ap.add_argument(
        "--no-tune-malloc", action="store_true", help="keep glibc's defaults (see tune_malloc)"
    )
    args = ap.parse_args()
    tuned = False if args.no_tune_malloc else tune_malloc()

    spec = ModelSpec.preset(args.preset)
    params = spec.init_params(0)
    limit = args.max_message_bytes or profile(args.profile).max_message_bytes
    nbytes = params.nbytes

    frames = encode_params(params, max_message_bytes=limit, transfer="bench")
    out = Params.zeros(spec)

    def dec() -> None:
        r = Reassembler.for_params(spec, transfer="bench", total=len(frames), out=out)
        for f in frames:
            r.add(decode(f))
        if not r.done:
            raise RuntimeError("benchmark transfer incomplete")

    src = params.data
    dst = np.empty_like(src)
    t_mem = best_seconds(lambda: np.copyto(dst, src), args.repeat)
    t_enc = best_seconds(
        lambda: encode_params(params, max_message_bytes=limit, transfer="bench"), args.repeat
    )
    t_dec = best_seconds(dec, args.repeat)
    if out.data.tobytes() != params.data.tobytes():
        raise RuntimeError("decode did not reproduce the params")

    figures = {
        "encode_gbps": nbytes / t_enc / 1e9,
        "decode_gbps": nbytes / t_dec / 1e9,
        "memcpy_gbps": nbytes / t_mem / 1e9,
    }
    if args.json:
        print(json.dumps({k: round(v, 3) for k, v in figures.items()}))
        return 0
    print(
        f"{args.preset}: {nbytes / 1e6:.1f} MB in {len(frames)} frames of <= {limit:,} bytes; "
        f"crc32 backend: {BACKEND}; malloc tuned: {tuned}"
    )
    for k, v in figures.items():
        print(f"  {k:12s} {v:7.2f}   ({v / figures['memcpy_gbps']:.2f} x memcpy)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
