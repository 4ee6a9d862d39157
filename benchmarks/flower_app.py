"""Flower's side of ``benchmarks/flower.py``: FedAvg on digits in Flower's simulation
engine, the model in numpy. Runs in Flower's own venv (no crowdgrad import).

    FLOWER_PYTHON benchmarks/flower_app.py DATA.npz --rounds 400 --target 0.95

``DATA.npz`` (written by ``benchmarks/flower.py`` from crowdgrad's job): the
training rows of each client's shard, the held-out split, the initial weights
(crowdgrad's version 0) and the hyperparameters. Each round samples
``clients_per_round`` of ``clients`` nodes; each takes ``tau`` SGD steps of
``batch`` rows drawn without replacement from its shard, from the global
model; FedAvg weights them by the rows they trained on; the server evaluates the
new model on the held-out split (no client-side evaluation, as in crowdgrad).

One line per evaluation on stdout, for the caller's clock::

    FLOWER-EVAL <round> <accuracy> <time.monotonic()>

At ``--target`` the process says ``FLOWER-TARGET`` and waits to be ended, with
every process Ray started below it (by the caller, which finds them by their
parent ids while they still have them).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation

LAYERS = 2  # [64, 128, 10]: W0, b0, W1, b1 (crowdgrad's layout: W is [out, in])


def forward(ws: list[np.ndarray], X: np.ndarray) -> list[np.ndarray]:
    """Activations of every layer: ReLU hidden, raw logits out (crowdgrad's model)."""
    acts = [X]
    for layer in range(LAYERS):
        W, b = ws[2 * layer], ws[2 * layer + 1]
        z = acts[-1] @ W.T + b
        acts.append(np.maximum(z, 0.0) if layer < LAYERS - 1 else z)
    return acts


def sgd_step(ws: list[np.ndarray], X: np.ndarray, y: np.ndarray, lr: float) -> None:
    """One step of mean softmax cross-entropy, in place."""
    acts = forward(ws, X)
    z = acts[-1] - acts[-1].max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    delta = p / len(y)
    for layer in range(LAYERS - 1, -1, -1):
        W = ws[2 * layer]
        gW, gb = delta.T @ acts[layer], delta.sum(axis=0)
        if layer > 0:
            delta = (delta @ W) * (acts[layer] > 0)
        ws[2 * layer] -= lr * gW
        ws[2 * layer + 1] -= lr * gb


def accuracy(ws: list[np.ndarray], X: np.ndarray, y: np.ndarray) -> float:
    return float((forward(ws, X)[-1].argmax(axis=1) == y).mean())


def build(data_path: str, rounds: int, target: float) -> tuple[ServerApp, ClientApp, int]:
    d = np.load(data_path)
    clients = int(d["clients"])
    tau, batch, lr = int(d["tau"]), int(d["batch"]), float(d["lr"])
    per_round = int(d["clients_per_round"])

    client = ClientApp()

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        part = int(context.node_config["partition-id"])
        data = np.load(data_path)
        X, y = data[f"X{part}"], data[f"y{part}"]
        ws = [a.copy() for a in msg.content["arrays"].to_numpy_ndarrays()]
        rng = np.random.default_rng([part, int(msg.content["config"]["server-round"])])
        need = tau * batch
        rows = np.concatenate([rng.permutation(len(y)) for _ in range(-(-need // len(y)))])
        for s in range(tau):
            idx = rows[s * batch : (s + 1) * batch]
            sgd_step(ws, X[idx], y[idx], lr)
        reply = RecordDict(
            {"arrays": ArrayRecord(ws), "metrics": MetricRecord({"num-examples": need})}
        )
        return Message(content=reply, reply_to=msg)

    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        init = [d[f"w{k}"] for k in range(2 * LAYERS)]
        X_test, y_test = d["X_test"], d["y_test"]

        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
            acc = accuracy(arrays.to_numpy_ndarrays(), X_test, y_test)
            print(f"FLOWER-EVAL {server_round} {acc:.6f} {time.monotonic()!r}", flush=True)
            if acc >= target:
                print("FLOWER-TARGET", flush=True)
                # Wait for the caller to end this process and the ones Ray started
                # (exiting here would orphan them before it could find them).
                threading.Event().wait()
            return MetricRecord({"accuracy": acc})

        strategy = FedAvg(
            fraction_train=per_round / clients,
            fraction_evaluate=0.0,
            min_train_nodes=per_round,
            min_evaluate_nodes=0,
            min_available_nodes=clients,
        )
        strategy.start(
            grid=grid, initial_arrays=ArrayRecord(init), num_rounds=rounds, evaluate_fn=evaluate
        )

    return server, client, clients


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--cpus-per-client", type=float, default=1.0)
    args = ap.parse_args()
    print(f"FLOWER-START {time.monotonic()!r}", flush=True)
    server, client, clients = build(args.data, args.rounds, args.target)
    run_simulation(
        server_app=server,
        client_app=client,
        num_supernodes=clients,
        backend_config={"client_resources": {"num_cpus": args.cpus_per_client, "num_gpus": 0.0}},
    )
    print("FLOWER-END no target", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
