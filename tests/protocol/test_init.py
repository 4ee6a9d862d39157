"""The package is sans-IO and re-exports its public API."""

import ast
import subprocess
import sys
from pathlib import Path

import protocol

PKG = Path(protocol.__file__).parent
FORBIDDEN = {"asyncio", "socket", "websockets", "uvicorn", "fastapi", "time", "random", "threading"}


def test_no_module_imports_io_clocks_or_global_randomness():
    for path in PKG.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"


def test_importing_protocol_pulls_in_no_io_stack():
    code = (
        "import sys, protocol; "
        "print(sorted({'asyncio', 'socket', 'websockets', 'uvicorn'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_public_api_is_exported():
    for name in protocol.__all__:
        assert hasattr(protocol, name), name
