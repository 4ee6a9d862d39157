"""Small modules: every module of the product, and the test tooling, under 600 lines."""

from __future__ import annotations

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
    "testkit",
)
LIMIT = 600


def test_every_module_is_under_the_limit() -> None:
    long = [
        f"{path.relative_to(ROOT)} ({n} lines)"
        for pkg in PACKAGES
        for path in sorted((ROOT / pkg).rglob("*.py"))
        if (n := path.read_text().count("\n")) > LIMIT
    ]
    assert not long, f"over {LIMIT} lines: {long}"
