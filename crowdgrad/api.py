"""The two-line Python API: distribute an existing numpy training set-up.

In the spirit of TorchAD-NN (seed 003), a script that has a model spec and a
training set needs two added lines::

    from crowdgrad import ModelSpec, serve
    result = serve(spec, (X, y))          # trained Params, ready for nn.train.evaluate
    result.reason, result.evaluation      # why it stopped, the final test accuracy and loss

``serve`` starts a real coordinator (uvicorn on a loopback port, the core on
its own thread) for the in-memory dataset, runs ``clients`` local volunteers
against it (threads here; remote ones join the printed URL with ``crowdgrad
client``, and must hold the same data) and returns the model when the target
accuracy or ``max_versions`` is reached. Reaching ``timeout`` first is a
``TimeoutError`` (the target was not met) unless ``on_timeout="return"``.

The result is a :class:`ServeResult`: a ``Params`` (what ``serve`` returned
before, so such code keeps working) that also carries the stop reason and the
final evaluation. With ``progress`` (the default) joins, evaluations and the end
are written to stderr as they happen, at a readable rate.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from typing import Any, Literal

import numpy as np

from client.desktop import DesktopClient
from coordinator.core.config import parse_job
from coordinator.http.console import ConsoleLog
from coordinator.http.server import CrowdServer
from coordinator.http.serving import BackgroundServer
from coordinator.runtime.service import CoreService
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


class ServeResult(Params):
    """The trained model (a ``Params``, sharing its buffer) plus how the run ended.

    ``reason``: ``target_accuracy``, ``max_versions``, ``converged`` (the held-out
    loss stopped improving: the model is its best evaluation's), or ``max_time`` (only with
    ``on_timeout="return"``); ``evaluation``: the final ``{"version", "accuracy",
    "loss"}`` on the held-out split (None if none ran); ``version``: the model
    version; ``seconds``: wall time of the run.
    """

    __slots__ = ("evaluation", "reason", "seconds", "version")

    def __init__(
        self,
        params: Params,
        *,
        reason: str,
        evaluation: dict[str, float] | None,
        version: int,
        seconds: float,
    ) -> None:
        super().__init__(params.spec, params.data)
        self.reason = reason
        self.evaluation = evaluation
        self.version = version
        self.seconds = seconds

    @property
    def params(self) -> Params:
        """The weights as a plain ``Params`` (the same buffer)."""
        return Params(self.spec, self.data)

    def __repr__(self) -> str:
        acc = "n/a" if self.evaluation is None else f"{self.evaluation['accuracy']:.4f}"
        return (
            f"ServeResult(widths={list(self.spec.widths)}, reason={self.reason!r}, "
            f"version={self.version}, accuracy={acc})"
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
    on_timeout: Literal["raise", "return"] = "raise",
    progress: bool = True,
) -> ServeResult:
    """Train ``spec`` on ``data`` with a coordinator and ``clients`` local volunteers.

    ``overrides`` sets job-file fields by section (``{"link": {"profile": "roblox"}}``).
    A run that hits ``timeout`` before its target is a ``TimeoutError`` naming how
    far it got, unless ``on_timeout="return"``; ``progress`` writes what happens to
    stderr (module docstring).
    """
    if on_timeout not in ("raise", "return"):
        raise ValueError(f"on_timeout: 'raise' or 'return', got {on_timeout!r}")
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
    t0 = time.monotonic()
    service = CoreService(parse_job(sections, source="serve()"), seed=seed, dataset=dataset)
    if progress:
        service.add_sink(ConsoleLog(_to_stderr, interval=10.0, burst=3))
    # Built before the server: a first run compiles the numba kernels (about a
    # minute), which must not count against the server's start-up timeout.
    service.start()
    crowd = CrowdServer(service)
    with BackgroundServer(crowd, host=host, port=port) as bg:
        log.info("coordinator for %s at %s", spec.widths, bg.url)
        if progress:
            _to_stderr(
                f"serve: coordinator at {bg.url} (dashboard {bg.http}/dashboard), "
                f"{clients} local clients; more can join with: crowdgrad client {bg.url}"
            )
        workers = [
            DesktopClient(bg.url, name=f"local{i}", data=dataset, flops=1e9, seed=seed + i)
            for i in range(clients)
        ]
        threads = [
            threading.Thread(target=asyncio.run, args=(w.run(),), daemon=True) for w in workers
        ]
        for t in threads:
            t.start()
        finished = service.done.wait(timeout)
        params = service.call(lambda core: core.params.copy()).result(30)
        st = service.stats
        for w in workers:
            w.request_stop()
        for t in threads:
            t.join(10)
    service.stop()
    fin = st.finished if finished else None
    reason = "max_time" if fin is None else str(fin["reason"])
    result = ServeResult(
        params,
        reason=reason,
        evaluation=dict(st.last_eval) if st.last_eval else None,
        version=st.version,
        seconds=time.monotonic() - t0,
    )
    if reason == "max_time" and on_timeout == "raise":
        got = (
            "no evaluation"
            if result.evaluation is None
            else (f"test accuracy {result.evaluation['accuracy']:.4f}")
        )
        raise TimeoutError(
            f"serve: timeout after {timeout:g} s at model v{result.version} ({got}), before "
            f"target_accuracy={target_accuracy} or max_versions={max_versions}; raise timeout, "
            "or pass on_timeout='return' to get the model anyway"
        )
    return result


def _to_stderr(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
