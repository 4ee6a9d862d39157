"""Helpers for coordinator scenario tests: jobs, hellos, results as wire messages."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from coordinator.core import events as ev
from coordinator.core.assembly import build_core
from coordinator.core.config import JobConfig, parse_job
from coordinator.core.machine import Coordinator
from nn.data import Dataset, load_dataset
from nn.params import Params
from protocol import messages as m
from protocol.chunking import chunk_params


@functools.cache
def digits() -> Dataset:
    return load_dataset("digits", seed=0)


def make_job(name: str = "decentral-async", /, **sections: dict[str, Any]) -> JobConfig:
    """A small fast job on digits; ``sections`` override fields per section."""
    data: dict[str, Any] = {
        "model": {"widths": [64, 16, 10]},
        "data": {"shards": 4, "batch": 8},
        "strategy": {"name": name, "tau": 2, "lr": 0.05},
        "eval": {"every_versions": 1000, "max_samples": 64},
        "lease": {"min_s": 10.0, "slack": 1.0},
    }
    for key, fields in sections.items():
        data[key] = {**data.get(key, {}), **fields}
    return parse_job(data)


def make_core(name: str = "decentral-async", /, seed: int = 0, **sections: Any) -> Coordinator:
    return build_core(make_job(name, **sections), seed=seed, dataset=digits())


def hello(name: str, *, resume: str | None = None, **kw: Any) -> m.Hello:
    return m.Hello(client=name, flops=1e9, resume=resume, **kw)


def sent(outputs: list[ev.Output], client_id: str | None = None, kind: type | None = None) -> list:
    """Messages of the Send actions, optionally for one client and of one type."""
    return [
        o.message
        for o in outputs
        if isinstance(o, ev.Send)
        and (client_id is None or o.client_id == client_id)
        and (kind is None or isinstance(o.message, kind))
    ]


def only(outputs: list[ev.Output], kind: type) -> list:
    return [o for o in outputs if isinstance(o, kind)]


def task_of(outputs: list[ev.Output], client_id: str) -> m.Task:
    tasks = sent(outputs, client_id, m.Task)
    assert len(tasks) == 1, f"expected one task for {client_id}, got {len(tasks)}"
    return tasks[0]


def result_messages(
    task: m.Task,
    update: np.ndarray | None = None,
    *,
    version: int | None = None,
    spans: bool = False,
    codec: str = "fp32",
) -> list[m.Message]:
    """What a client sends for ``task``: a result and the update's chunks
    (``codec``: the job's update codec, ``task.upload_codec``)."""
    spec = task.spec
    if update is None:
        update = np.full(spec.num_params, 1e-3, dtype=np.float32)
    chunks = chunk_params(
        Params.from_flat(spec, update.astype(np.float32)),
        max_message_bytes=1 << 20,
        transfer=task.task_id,
        spans=spans,
        codec=codec,
    )
    res = m.Result(
        task_id=task.task_id,
        model_version=task.model_version if version is None else version,
        kind=task.kind,
        num_chunks=len(chunks),
        samples=task.steps * task.batch,
        steps=task.steps,
        compute_seconds=0.01,
    )
    return [res, *chunks]


def deliver(
    core: Coordinator, client_id: str, msgs: list[m.Message], now: float
) -> list[ev.Output]:
    out: list[ev.Output] = []
    for msg in msgs:
        out += core.receive(client_id, msg, now)
    return out


def acks(outputs: list[ev.Output], client_id: str | None = None) -> list[tuple[str, bool, str]]:
    return [(a.task_id, a.accepted, a.reason) for a in sent(outputs, client_id, m.Ack)]
