"""The layers of the house hold: import-linter's contracts in pyproject.toml are kept,
and they fail when a core module reaches for IO."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nn", "compression", "protocol", "storage", "client", "coordinator", "simulations")
LINT = [sys.executable, "-c", "from importlinter.cli import lint_imports_command as c; c()"]


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "NO_COLOR": "1"}
    return subprocess.run(LINT, cwd=root, capture_output=True, text=True, env=env, timeout=120)


def test_the_layers_and_the_sans_io_rule_are_kept() -> None:
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "BROKEN" not in out.stdout and "KEPT" in out.stdout


def _copy(tmp_path: Path) -> Path:
    for name in (*PACKAGES, "crowdgrad"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("web"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_a_core_module_that_imports_sqlite3_breaks_the_contract(tmp_path) -> None:
    root = _copy(tmp_path)
    with (root / "coordinator/core/leases.py").open("a") as f:
        f.write("\nimport sqlite3  # noqa\n")
    out = _lint(root)
    assert out.returncode != 0
    assert "coordinator.core is not allowed to import sqlite3" in out.stdout


def test_a_client_that_imports_the_cli_breaks_the_layers(tmp_path) -> None:
    root = _copy(tmp_path)
    with (root / "client/compute.py").open("a") as f:
        f.write("\nimport crowdgrad.cli  # noqa\n")
    out = _lint(root)
    assert out.returncode != 0
    assert "client is not allowed to import crowdgrad" in out.stdout
