"""coordinator/http/clientwheel.py without a build: what a source tree holds, the
cache key, and the routes' answers where no wheel can be made (the build and the
installed path run for real in tests/e2e/test_client_wheel.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from fastapi import FastAPI
from fastapi.testclient import TestClient

from coordinator.http.clientwheel import ClientWheel, SourceTree, add_routes, wheel_name

PYPROJECT = """
[project]
name = "crowdgrad"
version = "1.2.3"
[tool.setuptools]
packages = { find = { include = ["nn*", "client*"] } }
"""


def _tree(root: Path) -> SourceTree:
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / "README.md").write_text("hi")
    for rel in ("nn/__init__.py", "client/web/static/index.html", "client/x.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    for junk in ("nn/__pycache__/a.pyc", "client/web/node_modules/m.js", "client/.hidden/x"):
        (root / junk).parent.mkdir(parents=True, exist_ok=True)
        (root / junk).write_text("junk")
    (root / "tests").mkdir()
    (root / "tests/test_x.py").write_text("not in the wheel")
    tree = SourceTree.find(root)
    assert tree is not None
    return tree


def test_a_source_tree_is_what_the_build_reads_and_its_key_follows_every_edit(tmp_path) -> None:
    tree = _tree(tmp_path)
    assert tree.version == "1.2.3" and tree.packages == ("client", "nn")
    files = [p.as_posix() for p in tree.files()]
    assert files == [
        "pyproject.toml", "README.md", "client/x.py", "client/web/static/index.html",
        "nn/__init__.py",
    ]  # fmt: skip
    key = tree.digest(tree.files())
    (tmp_path / "client/web/static/index.html").write_text("edited")
    assert tree.digest(tree.files()) != key
    (tmp_path / "nn/__pycache__/a.pyc").write_text("compiled again")
    assert tree.digest(tree.files()) == tree.digest(tree.files())


def test_another_project_is_no_source_tree(tmp_path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "other"\n')
    assert SourceTree.find(tmp_path) is None
    assert SourceTree.find(tmp_path / "missing") is None
    assert wheel_name("1.0.0-rc1") == "crowdgrad-1.0.0_rc1-py3-none-any.whl"


def test_without_a_wheel_the_routes_say_why_and_the_page_gets_no_command(tmp_path) -> None:
    """Code that runs neither from a checkout nor from the installed distribution
    (here: a folder that is neither) has nothing honest to serve."""
    wheel = ClientWheel(root=tmp_path, cache=tmp_path / "cache")
    assert isinstance(wheel.origin(), str) and wheel.version is None
    app = FastAPI()
    add_routes(app, SimpleNamespace(join_token=None), wheel)  # type: ignore[arg-type]
    http = TestClient(app)
    info = http.get("/api/client").json()
    assert info["available"] is False and info["reason"] == wheel.origin()
    assert "install" not in info
    down = http.get("/client/")
    assert down.status_code == 503 and "no client wheel" in down.json()["detail"]
    assert http.get("/client/crowdgrad-0.1.0-py3-none-any.whl").status_code == 404


def test_the_commands_name_this_host_and_ask_for_a_token_when_one_is_set(tmp_path) -> None:
    _tree(tmp_path)
    app = FastAPI()
    wheel = ClientWheel(root=tmp_path, cache=tmp_path / "cache")
    add_routes(app, SimpleNamespace(join_token="s3cret"), wheel)  # type: ignore[arg-type]
    info = TestClient(app, base_url="https://crowd.example:8443").get("/api/client").json()
    name = "crowdgrad-1.2.3-py3-none-any.whl"
    assert info["wheel"] == name and info["url"] == f"client/{name}"
    assert info["install"] == f"pipx install https://crowd.example:8443/client/{name}"
    assert info["run"] == "crowdgrad client wss://crowd.example:8443/ws --token TOKEN"
    assert "s3cret" not in str(info)
    other = TestClient(app).get("/client/crowdgrad-9.9.9-py3-none-any.whl")
    assert other.status_code == 404 and name in other.json()["detail"]
