"""Session 20: what auto deltas cost the coordinator's CPU. For the generated job's
model (85,002 parameters) and a 1.6 M-parameter one, the wall time of
``DeltaServer.served`` (a snapshot of each served version) and of one ``delta``
(the step since the last version, encoded in int4-sr as chunks), mean of 30
versions, one thread. An asynchronous job encodes about one delta per task
issued to a slow client holding a kept version (the cache holds per version
pair, and every merge makes a new version). From the repository root:

    python docs/results/2026-11-29/delta_cost.py
"""

import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, ".")

import numpy as np

from coordinator.core.config import CodecSection
from coordinator.core.downloads import DeltaServer
from nn.spec import ModelSpec

for widths in ((64, 256, 256, 10), (64, 1024, 1024, 512, 10)):
    spec = ModelSpec(widths=widths)
    params = spec.init_params(0)
    server = DeltaServer(CodecSection(), spec, np.random.default_rng(0), 16)
    rng = np.random.default_rng(1)
    server.served(0, params)
    n, snap, enc = 30, 0.0, 0.0
    for v in range(1, n + 1):
        params.data += rng.standard_normal(params.data.size).astype(np.float32) * 1e-3
        t0 = time.perf_counter()
        server.served(v, params)
        t1 = time.perf_counter()
        server.delta(v - 1, v, codec="int4-sr", max_message_bytes=16 << 20)
        t2 = time.perf_counter()
        snap, enc = snap + t1 - t0, enc + t2 - t1
    sys.stdout.write(
        f"{spec.num_params:>9,} parameters: snapshot {snap / n * 1e3:.2f} ms, "
        f"int4-sr delta {enc / n * 1e3:.2f} ms\n"
    )
