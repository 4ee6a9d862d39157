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
        assert row["disagreed"] == 0, name
        assert 0 < row["max_distance"] < r["rule"]["distance"], name
    assert r["honest_exclusions"] == 0
    for pairing, p in r["pairings"].items():
        assert p["strikes"] == {"python": 0, "js": 0, "wasm": 0}, pairing
        assert p["honest_struck_beside_liars"] == 0, pairing
    for kind, row in r["lies"].items():
        assert row["planted"] == 10, kind
        # a stale liar's first upload is its honest update; every later one is a lie
        want = row["planted"] - 1 if kind == "stale" else row["planted"]
        assert row["caught"] == want, kind
        # with twins of its own family every liar is excluded, whatever it claims;
        # across families only one that claims the coordinator's kernel can be
        assert r["pairings"]["same-kernel"]["lies_excluded"][kind] == ["python", "js", "wasm"]
        assert r["pairings"]["cross-kernel"]["lies_excluded"][kind] == ["python"]
    assert r["max_loss_rel"] < 1e-5


def _task() -> m.Task:
    return m.Task(task_id="1", model_version=0, spec=JobConfig().spec, dataset="x",
                  base_version=0, kind="train", steps=1, batch=1, seed=0)  # fmt: skip


def test_the_tally_judges_with_the_coordinators_rule(bench) -> None:
    """The tally's teeth. An implementation off the coordinator's run (here a WASM
    update with three values reversed) is inconclusive across families, never
    struck; a liar that claims WASM, twinned with an honest WASM client, is struck
    on every lie and excluded at the third."""
    tally = bench.Tally(JobConfig())
    honest = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    off = honest.copy()
    off[:3] *= -1  # far outside the values and the distance rule
    for _ in range(3):  # one task per implementation as the primary's holder
        tally.add(_task(), {"python": honest, "js": honest.copy(), "wasm": off},
                  {"python": 1.0, "js": 1.0, "wasm": 1.0})  # fmt: skip
    rep = tally.report()
    assert rep["pairs"]["python-js"]["disagreed"] == 0
    assert rep["pairs"]["python-wasm"]["disagreed"] == 3
    assert rep["pairs"]["js-wasm"]["inconclusive"] == 3
    cross = rep["pairings"]["cross-kernel"]["honest"]
    assert cross["wasm"]["inconclusive"] > 0 and cross["wasm"]["struck"] == 0
    assert rep["honest_exclusions"] == 0
    tally = bench.Tally(JobConfig())
    ups = {"python": honest, "js": honest.copy(), "wasm": honest * np.float32(1.0001)}
    for _ in range(3):
        tally.add(_task(), ups, {"python": 1.0, "js": 1.0, "wasm": 1.0}, {"sign_flip": -honest})
    same = tally.report()["pairings"]["same-kernel"]["lies"]["sign_flip"]
    assert [same[i]["struck"] for i in ("python", "js", "wasm")] == [3, 3, 3]
    assert same["wasm"]["excluded_after"] == 3
