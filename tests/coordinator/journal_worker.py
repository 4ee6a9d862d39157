"""A coordinator service whose results are all in-place sub-model merges, run as a
real process for tests/coordinator/test_journal.py to SIGKILL.

    python journal_worker.py STORE RESULTS [dump]

Prints ``task <task id>`` as each task leaves the service, ``acked <task id>``
as each ack does (only then has the client been told), and with ``dump`` writes
the model and its version to ``STORE.npy`` once every ack is out, prints
``dumped`` and waits to be killed.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np

from coordinator.core import events as ev
from coordinator.core.config import parse_job
from coordinator.runtime.service import CoreService
from protocol import messages as m
from tests.coordinator.coord_helpers import result_messages

JOB = {
    "model": {"widths": [64, 256, 256, 10]},
    "data": {"shards": 4, "batch": 8},
    "strategy": {"name": "decentral-async", "tau": 2, "window": 1},
    "submodel": {"mode": "ist", "fraction": 0.125, "group": 8},
    # int8 uploads: logged in their wire form, a quarter of float32's bytes
    "codecs": {"update": "int8"},
    "checkpoint": {"every_versions": 7},
    "eval": {"every_versions": 1000},
}


def main(store: str, results: int, dump: bool) -> None:
    tasks: list[m.Task] = []
    acked: list[str] = []
    cond = threading.Condition()

    def sink(outputs: list[ev.Output]) -> None:
        with cond:
            for o in outputs:
                if isinstance(o, ev.Send) and isinstance(o.message, m.Task):
                    tasks.append(o.message)
                    print(f"task {o.message.task_id}", flush=True)
                elif isinstance(o, ev.Send) and isinstance(o.message, m.Ack) and o.message.accepted:
                    acked.append(o.message.task_id)
                    print(f"acked {o.message.task_id}", flush=True)
            cond.notify_all()

    rng = np.random.default_rng(0)
    service = CoreService(parse_job(JOB), store=store, durable_interval=1e4)
    service.add_sink(sink)
    service.start()
    service.submit_connect("a", m.Hello(client="a", codecs=("fp32", "int8")))
    with cond:  # the sink prints from the service's thread: never mid-line
        print("ready", flush=True)
    for n in range(1, results + 1):
        with cond:
            cond.wait_for(lambda n=n: len(tasks) >= n)
            task = tasks[n - 1]
        update = rng.standard_normal(task.spec.num_params).astype(np.float32) * 1e-2
        if n % 4 == 0:  # norm 10x the median: the validator clips it, the log says so
            update *= 10
        for msg in result_messages(task, update, codec=task.upload_codec):
            service.submit_receive("a", msg, len(m.encode(msg)))
    if dump:
        with cond:
            cond.wait_for(lambda: len(acked) >= results)
        params, version = service.call(lambda c: (c.params.data.copy(), c.version)).result()
        np.save(f"{store}.npy", np.append(params, np.float32(version)))
        with cond:
            print("dumped", flush=True)
    time.sleep(120)  # until killed


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), len(sys.argv) > 3 and sys.argv[3] == "dump")
