"""Docstrings as contracts: every module says what it promises, in a few lines.

History, measurements and alternatives tried belong in docs/ (docs/decisions.md for reasoning
with no other home), so a module docstring stays short enough to read before the code.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_module_sizes import PACKAGES, ROOT

LIMIT = 22


def _modules() -> list[Path]:
    return [path for pkg in PACKAGES for path in sorted((ROOT / pkg).rglob("*.py"))]


def _docstring(path: Path) -> str | None:
    return ast.get_docstring(ast.parse(path.read_text(), filename=str(path)))


def test_the_packages_hold_modules() -> None:
    assert len(_modules()) > 100


def test_every_module_has_a_docstring() -> None:
    missing = [str(path.relative_to(ROOT)) for path in _modules() if not _docstring(path)]
    assert not missing, f"no module docstring: {missing}"


def test_no_module_docstring_is_over_the_limit() -> None:
    long = [
        f"{path.relative_to(ROOT)} ({n} lines)"
        for path in _modules()
        if (doc := _docstring(path)) and (n := len(doc.splitlines())) > LIMIT
    ]
    assert not long, f"module docstrings over {LIMIT} lines (move the rest to docs/): {long}"
