"""The two-line Python API: distribute an existing numpy training set-up.

In the spirit of TorchAD-NN (seed 003), a script that has a model spec and a
training set needs two added lines::

    from crowdgrad import serve
    params = serve(spec, (X, y))          # trained Params, ready for nn.train.evaluate

``serve`` starts a real coordinator (uvicorn on a loopback port, the core on
its own thread) for the in-memory dataset, runs ``clients`` local volunteers
against it (threads here; remote ones join the printed URL with ``crowdgrad
client``, and must hold the same data) and returns the model when the target
accuracy, ``max_versions`` or ``timeout`` is reached.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import numpy as np

from client.desktop import DesktopClient
from coordinator.config import parse_job
from coordinator.server import BackgroundServer, CrowdServer
from coordinator.service import CoreService
from nn.data import Dataset, split_indices
from nn.params import Params
from nn.spec import ModelSpec

log = logging.getLogger(__name__)


def make_dataset(
    X: np.ndarray, y: np.ndarray, *, test_fraction: float = 0.2, seed: int = 0
) -> Dataset:
    """A seeded train/test split of user arrays (integer labels: classification)."""
    X = np.ascontiguousarray(X, dtype=np.float32)
    y = np.asarray(y)
    if X.ndim != 2 or y.shape[:1] != X.shape[:1]:
        raise ValueError(f"data: need X [n, features] and y [n], got {X.shape} and {y.shape}")
    train, test = split_indices(X.shape[0], test_fraction, seed)
    classes = int(y.max()) + 1 if np.issubdtype(y.dtype, np.integer) else None
    if classes is None:
        y = y.astype(np.float32)
    return Dataset(
        name="memory",
        X_train=X[train],
        y_train=y[train],
        X_test=X[test],
        y_test=y[test],
        num_classes=classes,
    )


def serve(
    spec: ModelSpec,
    data: tuple[np.ndarray, np.ndarray] | Dataset,
    *,
    clients: int = 4,
    strategy: str = "decentral-async",
    target_accuracy: float | None = 0.95,
    max_versions: int | None = 2000,
    timeout: float = 600.0,
    tau: int = 10,
    lr: float = 0.1,
    batch: int = 16,
    shards: int | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    seed: int = 0,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> Params:
    """Train ``spec`` on ``data`` with a coordinator and ``clients`` local volunteers.

    ``overrides`` sets job-file fields by section (``{"link": {"profile": "roblox"}}``).
    """
    if clients < 0:
        raise ValueError(f"clients: must be >= 0, got {clients}")
    dataset = data if isinstance(data, Dataset) else make_dataset(*data, seed=seed)
    if dataset.num_features != spec.widths[0]:
        raise ValueError(
            f"data: {dataset.num_features} features, but the model's input width is "
            f"{spec.widths[0]}"
        )
    sections: dict[str, Any] = {
        "name": "serve",
        "model": {
            "widths": list(spec.widths),
            "activations": list(spec.activations),
            "loss": spec.loss,
            "init": spec.init,
            "init_seed": seed,
        },
        "data": {"dataset": "memory", "shards": shards or max(1, 2 * clients), "batch": batch},
        "strategy": {"name": strategy, "tau": tau, "lr": lr},
        "stop": {
            "target_accuracy": target_accuracy,
            "max_versions": max_versions,
            "max_time_s": timeout,
        },
    }
    for key, fields in (overrides or {}).items():
        sections[key] = {**sections.get(key, {}), **fields}
    service = CoreService(parse_job(sections, source="serve()"), seed=seed, dataset=dataset)
    crowd = CrowdServer(service)
    with BackgroundServer(crowd, host=host, port=port) as bg:
        log.info("coordinator for %s at %s", spec.widths, bg.url)
        workers = [
            DesktopClient(bg.url, name=f"local{i}", data=dataset, flops=1e9, seed=seed + i)
            for i in range(clients)
        ]
        threads = [
            threading.Thread(target=asyncio.run, args=(w.run(),), daemon=True) for w in workers
        ]
        for t in threads:
            t.start()
        service.done.wait(timeout)
        params = service.call(lambda core: core.params.copy()).result(30)
        for w in workers:
            w.request_stop()
        for t in threads:
            t.join(10)
    return params
