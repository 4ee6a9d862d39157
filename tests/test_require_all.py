"""CROWDGRAD_REQUIRE_ALL turns a skip into a failure (tests/conftest.py): CI sets it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(tmp_path: Path, require: str | None) -> subprocess.CompletedProcess[str]:
    test = tmp_path / "test_needs_something.py"
    test.write_text("import pytest\n\ndef test_x():\n    pytest.skip('no chromium here')\n")
    env = {k: v for k, v in os.environ.items() if k != "CROWDGRAD_REQUIRE_ALL"}
    if require is not None:
        env["CROWDGRAD_REQUIRE_ALL"] = require
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         str(test), "--rootdir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_skip_fails_under_require_all(tmp_path: Path) -> None:
    res = _run(tmp_path, "1")
    assert res.returncode == 1, res.stdout
    assert "1 failed" in res.stdout
    assert "no chromium here" in res.stdout


def test_a_skip_is_a_skip_otherwise(tmp_path: Path) -> None:
    for value in (None, "0"):
        res = _run(tmp_path, value)
        assert res.returncode == 0, res.stdout
        assert "1 skipped" in res.stdout
