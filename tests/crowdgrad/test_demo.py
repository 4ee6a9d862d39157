"""``crowdgrad demo`` as a newcomer meets it: phases, URLs, a timeline, a summary."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from crowdgrad.cli import main
from crowdgrad.commands.demo import accuracy_text, process_age


def test_the_demo_says_what_it_does_and_where_to_look(tmp_path) -> None:
    env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    argv = ["demo", "--clients", "2", "--target", "0.8", "--no-wait", "--store", "demo.db"]
    res = subprocess.run(
        [sys.executable, "-m", "crowdgrad", *argv],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    out = res.stdout
    assert res.returncode == 0, out + res.stderr
    assert "Traceback" not in out + res.stderr
    for phrase in ("[1/3] Serving at ws://127.0.0.1:", "[2/3] Starting 2 client processes",
                   "[3/3] Meanwhile, preparing the coordinator", "coordinator ready",
                   "first result accepted, from demo", "job finished (target_accuracy)",
                   "Summary", "reached test accuracy", "Next", "docs/formats.md"):  # fmt: skip
        assert phrase in out, phrase
    assert re.search(r"dashboard: +http://127\.0\.0\.1:\d+/dashboard", out)
    assert re.search(r"volunteers: +http://127\.0\.0\.1:\d+/ ", out)
    first = re.search(r"first accepted result at ([0-9.]+) s", out)
    assert first is not None and 0 < float(first.group(1)) < 120
    assert "accuracy 0.000" not in out
    assert "the trained model is checkpoint v" in out and " in demo.db: crowdgrad checkpoint" in out
    onnx = tmp_path / "model.onnx"
    assert (
        main(["checkpoint", "export", "--store", str(tmp_path / "demo.db"), "--out", str(onnx)])
        == 0
    )
    assert onnx.stat().st_size > 30_000


def test_no_evaluation_is_not_zero_accuracy() -> None:
    assert accuracy_text(None) == "no evaluation yet"
    assert accuracy_text({"accuracy": 0.91234, "version": 40, "loss": 0.3}) == "0.912 (v40)"
    assert 0.0 <= process_age() < 3600


def test_no_clients_is_a_usage_error(capsys, tmp_path) -> None:
    assert main(["demo", "--clients", "0"]) == 2
    assert "--clients must be >= 1" in capsys.readouterr().err
    (tmp_path / "old.db").write_bytes(b"")
    assert main(["demo", "--store", str(tmp_path / "old.db")]) == 2
    assert "old.db exists; the demo starts from scratch" in capsys.readouterr().err
    assert main(["demo", "--store", str(tmp_path / "nope" / "d.db")]) == 2
    assert "nope does not exist; create it first" in capsys.readouterr().err
