"""Small modules: one above 600 lines says why in its docstring ("Why long:")."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "nn",
    "protocol",
    "compression",
    "coordinator",
    "storage",
    "client",
    "simulations",
    "crowdgrad",
)
LIMIT = 600


def test_every_long_module_states_why() -> None:
    unexplained = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            text = path.read_text()
            if text.count("\n") <= LIMIT:
                continue
            doc = ast.get_docstring(ast.parse(text)) or ""
            if "Why long:" not in doc:
                unexplained.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert not unexplained, (
        f"over {LIMIT} lines without a 'Why long:' in the docstring: {unexplained}"
    )
