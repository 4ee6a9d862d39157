"""benchmarks/replicas.py on a small run: the Python client and the browser
client's JS and WASM kernels (under node) compute the same tasks, every pair
agrees under the coordinator's rule, and every planted lie is caught. (The
100,000-task figure is a benchmark, not a test.)"""

from __future__ import annotations

import shutil
from types import ModuleType

import numpy as np
import pytest

from coordinator.core.config import JobConfig
from protocol import messages as m
from tests.bench_module import load_benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("replicas")


@pytest.mark.skipif(
    shutil.which("node") is None, reason="needs node (the browser client's kernels)"
)
def test_three_implementations_agree_and_every_lie_is_caught(bench) -> None:
    r = bench.run("digits", tasks=40, batch=20, lie_every=4, seed=3)
    for name, row in r["pairs"].items():
        assert row["compared"] == 40, name
        assert row["disagreed"] == 0, (name, r["struck"])
        assert 0 < row["max_distance"] < r["rule"]["distance"], name
    assert r["strikes"] == {"python": 0, "js": 0, "wasm": 0}
    assert r["honest_exclusions"] == 0
    for kind, row in r["lies"].items():
        assert row["planted"] == 10, kind
        # a stale liar's first upload is its honest update; every later one is a lie
        want = row["planted"] - 1 if kind == "stale" else row["planted"]
        assert row["caught"] == want, kind
        assert row["excluded"], kind
    assert r["max_loss_rel"] < 1e-5


def test_a_result_off_the_coordinators_run_is_struck_on_its_holder(bench) -> None:
    """The tally's teeth: an implementation whose update is off (here reversed)
    disagrees, and the strike lands on it, judged by the Python run."""
    tally = bench.Tally(JobConfig())
    task = m.Task(task_id="1", model_version=0, spec=JobConfig().spec, dataset="x",
                  base_version=0, kind="train", steps=1, batch=1, seed=0)  # fmt: skip
    honest = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    off = honest.copy()
    off[:3] *= -1  # three values reversed: far outside the values and the distance rule
    tally.add(task, {"python": honest, "js": honest.copy(), "wasm": off},
              {"python": 1.0, "js": 1.0, "wasm": 1.0})  # fmt: skip
    assert tally.strikes == {"python": 0, "js": 0, "wasm": 1}
    rep = tally.report()
    assert rep["pairs"]["python-js"]["disagreed"] == 0
    assert rep["pairs"]["python-wasm"]["disagreed"] == 1
    assert rep["pairs"]["js-wasm"]["disagreed"] == 1
    assert [s["impl"] for s in rep["struck"]] == ["wasm"]
