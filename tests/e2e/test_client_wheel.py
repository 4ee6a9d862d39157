"""The desktop client as a package (issue 36), as a volunteer meets it.

A real coordinator serves its own version's wheel at ``/client/``; the command
``/api/client`` gives (the one the volunteer page shows) installs it into a clean
virtual environment (no system site-packages, nothing of this repository on its
path, another working directory), and that environment's ``crowdgrad client``
gets a result accepted. The installed package repacks into the wheel it came
from (what a coordinator installed from a wheel serves), and the sdist builds a
wheel that carries the volunteer page.

The dependencies come from the machine's package index (pip's own configuration),
constrained to the versions this environment runs, so the clean environment runs
what the suite tests. Where no index can be reached the tests skip, and
CROWDGRAD_REQUIRE_ALL=1 (CI) turns that skip into a failure. One coordinator, one
wheel and one environment serve the whole module.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.http.clientwheel import SourceTree

ROOT = Path(__file__).resolve().parents[2]
START_BOUND_S = 120.0
INSTALL_TIMEOUT_S = 900.0
#: pip's words for an index it cannot reach: a skip (a failure under REQUIRE_ALL)
OFFLINE = re.compile(
    r"NewConnectionError|Max retries exceeded|Temporary failure in name resolution|"
    r"Network is unreachable|No matching distribution found"
)


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a volunteer's shell: nothing of this repository."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def pip_install(python: Path, *args: str, constraints: Path, cwd: Path) -> None:
    """``python -m pip install ARGS`` with this environment's versions as constraints."""
    cons = [str(constraints), *os.environ.get("PIP_CONSTRAINT", "").split()]
    res = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", *args],
        env=clean_env(PIP_CONSTRAINT=" ".join(cons)), cwd=cwd,
        capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
    )  # fmt: skip
    if res.returncode != 0:
        out = res.stdout + res.stderr
        if OFFLINE.search(out):
            pytest.skip(f"no package index reachable for the clean environment: {out[-500:]}")
        raise AssertionError(f"pip install {' '.join(args)} failed:\n{out[-3000:]}")


def new_venv(where: Path) -> Path:
    """A virtual environment without system site-packages; its python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=300)
    cfg = (where / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in cfg
    return where / "bin" / "python"


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return resp.read()


@pytest.fixture(scope="module")
def constraints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This environment's distributions, ``name==version`` (crowdgrad left out)."""
    pins = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() != "crowdgrad":
            pins.setdefault(name.lower(), f"{name}=={dist.version}")
    path = tmp_path_factory.mktemp("pins") / "constraints.txt"
    path.write_text("\n".join(sorted(pins.values())) + "\n")
    return path


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``crowdgrad coordinator`` of this checkout; its http:// base URL. Its
    wheels go to a folder of this module's (the first request builds one)."""
    wheels = tmp_path_factory.mktemp("wheels")
    cmd = [sys.executable, "-m", "crowdgrad", "coordinator", "--port", "0", "--no-store"]
    cmd += ["--keep-running", "--widths", "64,16,10"]
    env = {**os.environ, "CROWDGRAD_WHEEL_DIR": str(wheels), "COLUMNS": "200"}
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    port: list[int] = []
    found = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if (m := re.search(r"ws://127\.0\.0\.1:(\d+)/ws", line)) and not port:
                port.append(int(m.group(1)))
                found.set()
        found.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert found.wait(START_BOUND_S) and port, "".join(lines)
        base = f"http://127.0.0.1:{port[0]}"
        deadline = time.monotonic() + START_BOUND_S
        while True:
            try:
                get(f"{base}/healthz")
                break
            except OSError:
                assert time.monotonic() < deadline, "".join(lines)
                time.sleep(0.1)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


@pytest.fixture(scope="module")
def served(coordinator: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """``/api/client`` and the wheel it names, downloaded."""
    info = json.loads(get(f"{coordinator}/api/client"))
    assert info["available"] is True, info
    data = get(f"{coordinator}/client/{info['wheel']}")
    path = tmp_path_factory.mktemp("download") / info["wheel"]
    path.write_bytes(data)
    return info, path


@pytest.fixture(scope="module")
def volunteer(
    served: tuple[dict, Path], constraints: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A clean virtual environment with the wheel installed from the coordinator's
    URL, as the page's command does (pipx: a venv of its own, then pip install)."""
    info, _ = served
    home = tmp_path_factory.mktemp("volunteer")
    python = new_venv(home / "venv")
    url = info["install"].removeprefix("pipx install ")
    assert url.startswith("http://127.0.0.1:") and url.endswith(info["wheel"])
    pip_install(python, url, constraints=constraints, cwd=home)
    return python


def test_the_pages_command_installs_a_client_that_gets_a_result_accepted(
    coordinator: str, served: tuple[dict, Path], volunteer: Path, tmp_path: Path
) -> None:
    info, wheel = served
    tree = SourceTree.find(ROOT)
    assert tree is not None
    version = tree.version
    assert info["version"] == version and info["wheel"] == f"crowdgrad-{version}-py3-none-any.whl"
    ws = coordinator.replace("http://", "ws://")
    assert info["install"] == f"pipx install {coordinator}/client/{info['wheel']}"
    assert info["run"] == f"crowdgrad client {ws}/ws"
    listing = get(f"{coordinator}/client/").decode()
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert f"href='{info['wheel']}#sha256={sha}'" in listing
    # What was installed is the wheel, not this checkout: its files, its script.
    bindir = volunteer.parent
    where = subprocess.run(
        [str(volunteer), "-c", "import client, crowdgrad; print(client.WEB_ROOT); "
         "print(crowdgrad.__version__)"],
        env=clean_env(), cwd=tmp_path, capture_output=True, text=True, check=True, timeout=120,
    ).stdout.split()  # fmt: skip
    web_root = Path(where[0])
    assert web_root.is_relative_to(bindir.parent) and where[1] == version
    with zipfile.ZipFile(wheel) as zf:
        shipped = {n for n in zf.namelist() if n.startswith("client/web/static/")}
    committed = {f"client/web/static/{p.name}" for p in (ROOT / "client/web/static").iterdir()}
    assert shipped == committed
    for name in committed:
        assert (web_root / Path(name).name).read_bytes() == (ROOT / name).read_bytes()
    # The second command, as the page prints it, until the coordinator accepts a result.
    client = subprocess.Popen(
        [str(bindir / "crowdgrad"), *info["run"].split()[1:], "--name", "from-the-wheel"],
        env=clean_env(COLUMNS="200"), cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + START_BOUND_S
        while True:
            rows = json.loads(get(f"{coordinator}/api/dashboard"))["clients"]
            mine = [r for r in rows if r["name"] == "from-the-wheel"]
            if mine and mine[0]["accepted"] > 0:
                break
            assert client.poll() is None, client.communicate()[0]
            assert time.monotonic() < deadline, rows
            time.sleep(0.2)
        client.send_signal(signal.SIGINT)  # Ctrl-C: finish or abandon, bye, exit 0
        out = client.communicate(timeout=60)[0]
    finally:
        if client.poll() is None:
            client.kill()
            client.communicate()
    assert client.returncode == 0, out
    assert "joined job 'job'" in out and "Traceback" not in out, out


def test_an_installed_crowdgrad_serves_the_wheel_it_was_installed_from(
    served: tuple[dict, Path], volunteer: Path, tmp_path: Path
) -> None:
    """A coordinator run from the installed wheel has no sources to build from: it
    repacks its installed files, each checked against RECORD."""
    _, wheel = served
    code = (
        "from coordinator.http.clientwheel import ClientWheel; w = ClientWheel(); "
        "print(type(w.origin()).__name__); print(w.path())"
    )
    out = subprocess.run(
        [str(volunteer), "-c", code], env=clean_env(CROWDGRAD_WHEEL_DIR=str(tmp_path / "w")),
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    origin, repacked = out.stdout.split()
    assert origin != "SourceTree" and Path(repacked).name == wheel.name
    with zipfile.ZipFile(wheel) as a, zipfile.ZipFile(repacked) as b:
        record = f"crowdgrad-{wheel.name.split('-')[1]}.dist-info/RECORD"
        names = sorted(set(a.namelist()) - {record})
        assert names == sorted(set(b.namelist()) - {record})
        for name in names:
            assert a.read(name) == b.read(name), name


def test_the_sdist_builds_a_wheel_with_the_volunteer_page(
    constraints: Path, tmp_path: Path
) -> None:
    """``python -m build`` (the PyPA front end): the sdist, then a wheel built from
    the unpacked sdist, which must therefore carry everything, the page included."""
    python = new_venv(tmp_path / "venv")
    pip_install(python, "build", constraints=constraints, cwd=tmp_path)
    tree = SourceTree.find(ROOT)
    assert tree is not None
    src = tmp_path / "src"
    for rel in tree.files():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes((ROOT / rel).read_bytes())
    res = subprocess.run(
        [str(python), "-m", "build", "--outdir", str(tmp_path / "dist"), str(src)],
        env=clean_env(), cwd=tmp_path, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
    )  # fmt: skip
    if res.returncode != 0 and OFFLINE.search(res.stdout + res.stderr):
        pytest.skip(f"no package index for the build back end: {res.stderr[-500:]}")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    (sdist,) = (tmp_path / "dist").glob("*.tar.gz")
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    static = sorted(p.name for p in (ROOT / "client/web/static").iterdir())
    with tarfile.open(sdist) as tf:
        in_sdist = {Path(n).name for n in tf.getnames() if "/client/web/static/" in n}
    assert sorted(in_sdist) == static
    with zipfile.ZipFile(wheel) as zf:
        for name in static:
            built = zf.read(f"client/web/static/{name}")
            assert built == (ROOT / "client/web/static" / name).read_bytes(), name
        assert (
            "crowdgrad = crowdgrad.cli:main"
            in zf.read(f"crowdgrad-{tree.version}.dist-info/entry_points.txt").decode()
        )
        assert not any(n.startswith(("tests/", "testkit/", "benchmarks/")) for n in zf.namelist())
