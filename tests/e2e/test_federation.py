"""Federated coordinators, all real processes: a root, two edges started before
it (the root unreachable: they train alone), two desktop clients on each edge.
The root's model, which it never trains itself, comes from both edges'
pseudo-gradients and reaches the accuracy the edges reached; each edge's
checkpoint holds its standing against the root (coordinator/core/upstream.py)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from coordinator.runtime.persist import from_checkpoint
from storage.store import CheckpointStore
from tests.e2e.e2e_helpers import HANG_GUARD_S, ROOT, clients, free_port

EXAMPLES = ROOT / "examples" / "federation"
ENV_THREADS = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def _status(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=5) as r:
            return json.loads(r.read())
    except OSError:
        return None


def _wait(what: str, pred: Any, procs: list[subprocess.Popen[bytes]]) -> Any:
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        for p in procs:
            assert p.poll() is None, f"{p.args} exited with {p.returncode} while waiting: {what}"
        value = pred()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"hung waiting for {what}")


@contextlib.contextmanager
def _coordinator(job: Path, port: int, log: Path, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    cmd = [sys.executable, "-m", "crowdgrad", "coordinator", "--job", str(job)]
    cmd += ["--port", str(port), "--keep-running", *extra]
    if "--store" not in extra:  # not the default store in the repository
        cmd.append("--no-store")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env={**os.environ, **ENV_THREADS}, stdout=out, stderr=out
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def test_two_edges_train_a_root_model_and_keep_their_standing(tmp_path: Path) -> None:
    root_port, ports = free_port(), [free_port(), free_port()]
    root_url = f"ws://127.0.0.1:{root_port}/ws"
    stores = [tmp_path / f"edge{i}.db" for i in range(2)]
    with contextlib.ExitStack() as stack:
        edges = [
            stack.enter_context(
                _coordinator(
                    EXAMPLES / "edge.toml",
                    port,
                    tmp_path / f"edge{i}.log",
                    *("--store", str(stores[i]), "--upstream", root_url),
                    *("--upstream-every-versions", "1000000", "--upstream-every-s", "1"),
                )
            )
            for i, port in enumerate(ports)
        ]
        for i, port in enumerate(ports):
            _wait(f"edge {i} up", lambda port=port: _status(port), edges)
            stack.enter_context(
                clients(f"ws://127.0.0.1:{port}/ws", [f"e{i}a", f"e{i}b"], "--quiet")
            )
        # The root is not there yet: each edge's crowd trains on its own.
        for i, port in enumerate(ports):
            _wait(
                f"edge {i} trains", lambda p=port: (_status(p) or {}).get("version", 0) >= 30, edges
            )

        # The example root with its target replaced by a version count: one
        # well-trained edge alone would reach 0.9 at the root's first step. Edges
        # sync each second (24 syncs take 12 s, 24 s for one edge alone): the
        # other's uplink is back from its backoff (at most 10 s) well before.
        job = (EXAMPLES / "root.toml").read_text()
        job = job.replace("target_accuracy = 0.9", "max_versions = 12")
        assert "max_versions = 12" in job
        (tmp_path / "root.toml").write_text(job)
        root = stack.enter_context(
            _coordinator(tmp_path / "root.toml", root_port, tmp_path / "root.log")
        )
        procs = [*edges, root]
        done = _wait("the root's end", lambda: (_status(root_port) or {}).get("finished"), procs)
        st = _status(root_port)
        assert st is not None
        assert done["reason"] == "max_versions" and done["accuracy"] >= 0.9, st
        # one pseudo-gradient a version (buffer_k 1), none refused
        assert st["accepted_results"] >= 12 and st["rejected_results"] == 0, st
        ups = [(_status(p) or {}).get("upstream") for p in ports]
        # no edge refused its own players' updates (a root model that overshoots
        # makes honest updates look abnormal to the edge's norm check)
        for port in ports:
            edge_st = _status(port) or {}
            assert edge_st.get("rejected_results") == 0, edge_st
        # both edges took part: each synced and rebased onto a root model
        assert all(u is not None and u["syncs"] >= 1 and u["root_version"] >= 1 for u in ups), ups

    # Each edge's last checkpoint (written as it stopped) holds its standing.
    for store, up in zip(stores, ups, strict=True):
        with CheckpointStore.open(store) as s:
            state = from_checkpoint(s.load_latest())
        assert "upstream" in state, sorted(state)
        assert state["upstream"]["syncs"] >= up["syncs"]
        assert state["upstream"]["base"] is not None
