"""The desktop client as a wheel, served by the coordinator itself.

``ClientWheel`` finds the wheel of the running code: built from a source checkout
(``pip wheel --no-deps`` from a clean copy of the files that go in, cached under
their sha256), or repacked from an installed wheel's files as its ``RECORD``
lists them, each hash checked; otherwise there is none, and it says why. Routes:
``GET /client/`` (a link with its sha256, readable by ``pip --find-links``; 503
with the reason when there is none), ``GET /client/<wheel>`` and ``GET
/api/client`` (the version and the two commands for this host; the join token is
never shown). Builds are renamed into place, so concurrent coordinators never see
half a file. The rules and the cache's location: docs/operations.md, "The desktop
client as a package".
"""

from __future__ import annotations

import asyncio
import base64
import csv
import hashlib
import html
import importlib.metadata as md
import io
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

import client

if TYPE_CHECKING:
    from coordinator.http.server import CrowdServer

PROJECT = "crowdgrad"
#: Files of a source checkout that are no part of a build.
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "node_modules", ".*", "*.nbi", "*.nbc")
#: The seconds a build may take (pip fetches setuptools the first time).
BUILD_TIMEOUT_S = 300.0


class WheelUnavailable(Exception):
    """No wheel of this coordinator can be made; the message says why."""


def cache_dir() -> Path:
    if explicit := os.environ.get("CROWDGRAD_WHEEL_DIR"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "crowdgrad" / "client-wheels"


def wheel_name(version: str) -> str:
    """The wheel's file name (PEP 427: ``-`` in the version becomes ``_``)."""
    return f"{PROJECT}-{version.replace('-', '_')}-py3-none-any.whl"


@dataclass(frozen=True, slots=True)
class SourceTree:
    """A checkout: ``root`` holds pyproject.toml and the packages."""

    root: Path
    version: str
    packages: tuple[str, ...]  # the top-level package folders the wheel takes

    @classmethod
    def find(cls, root: Path) -> SourceTree | None:
        try:
            meta = tomllib.loads((root / "pyproject.toml").read_text())
        except (OSError, tomllib.TOMLDecodeError):
            return None
        project = meta.get("project", {})
        if project.get("name") != PROJECT:
            return None
        found = meta.get("tool", {}).get("setuptools", {}).get("packages", {}).get("find", {})
        tops = sorted({p.split(".")[0].rstrip("*") for p in found.get("include", ())})
        return cls(root, str(project.get("version", "0")), tuple(t for t in tops if t))

    def files(self) -> list[Path]:
        """What a build reads, relative to ``root``, in a fixed order."""
        tops = ("pyproject.toml", "README.md", "LICENSE")
        out = [Path(n) for n in tops if (self.root / n).is_file()]
        for top in self.packages:
            for dirpath, dirnames, filenames in os.walk(self.root / top):
                ignored = _SKIP(dirpath, dirnames + filenames)
                dirnames[:] = sorted(d for d in dirnames if d not in ignored)
                base = Path(dirpath).relative_to(self.root)
                out += [base / f for f in sorted(filenames) if f not in ignored]
        return out

    def digest(self, files: list[Path]) -> str:
        h = hashlib.sha256()
        for rel in files:
            data = (self.root / rel).read_bytes()
            h.update(f"{rel.as_posix()}\0{len(data)}\0".encode())
            h.update(data)
        return h.hexdigest()


class ClientWheel:
    """This coordinator's wheel: where it comes from, made once, then a file."""

    def __init__(self, *, root: Path | None = None, cache: Path | None = None) -> None:
        self._root = root if root is not None else Path(client.__file__).resolve().parent.parent
        self._cache = cache
        self._lock = threading.Lock()
        self._path: Path | None = None

    @property
    def cache(self) -> Path:
        return self._cache if self._cache is not None else cache_dir()

    def origin(self) -> SourceTree | md.Distribution | str:
        """The source tree or installed distribution the wheel comes from, or why none."""
        tree = SourceTree.find(self._root)
        if tree is not None:
            return tree
        # An installed wheel's RECORD lists its files; an editable install's lists no
        # package files, and a checkout's own egg-info (found first when the code runs
        # from it) has no RECORD at all.
        for dist in md.distributions(name=PROJECT):
            if "\nclient/__init__.py," not in "\n" + (dist.read_text("RECORD") or ""):
                continue
            located = Path(str(dist.locate_file("client/__init__.py"))).resolve()
            if located != Path(client.__file__).resolve():
                return f"the installed {PROJECT} at {located.parent.parent} is not the running one"
            return dist
        return (
            f"{PROJECT} runs from {self._root}, neither a source checkout nor an installed "
            "wheel (an editable install whose checkout moved, or a modified install)"
        )

    @property
    def version(self) -> str | None:
        found = self.origin()
        if isinstance(found, SourceTree):
            return found.version
        if isinstance(found, md.Distribution):
            return found.version
        return None

    def path(self) -> Path:
        """The wheel file: built or repacked on the first call (blocking; seconds for
        a build), then the same file. Raises WheelUnavailable."""
        with self._lock:
            if self._path is not None and self._path.is_file():
                return self._path
            found = self.origin()
            if isinstance(found, str):
                raise WheelUnavailable(found)
            if isinstance(found, SourceTree):
                self._path = self._built(found)
            else:
                self._path = self._repacked(found)
            return self._path

    def _built(self, tree: SourceTree) -> Path:
        files = tree.files()
        final = self.cache / f"src-{tree.digest(files)[:32]}" / wheel_name(tree.version)
        if final.is_file():
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=".build-") as tmp:
            src, out = Path(tmp) / "src", Path(tmp) / "out"
            for rel in files:
                (src / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(tree.root / rel, src / rel)
            cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet"]
            cmd += ["--wheel-dir", str(out), str(src)]
            try:
                res = subprocess.run(
                    cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise WheelUnavailable(f"building the wheel failed: {exc}") from None
            wheels = sorted(out.glob("*.whl"))
            if res.returncode != 0 or len(wheels) != 1:
                tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
                raise WheelUnavailable(
                    f"building the wheel with pip failed (exit {res.returncode}): "
                    + " | ".join(tail)
                )
            os.replace(wheels[0], final)
        return final

    def _repacked(self, dist: md.Distribution) -> Path:
        name = wheel_name(dist.version)
        buf = io.BytesIO()
        record: list[tuple[str, str, str]] = []
        dist_info = f"{PROJECT}-{dist.version}.dist-info/"
        leave = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for f in sorted(dist.files or (), key=lambda p: p.as_posix()):
                arc = f.as_posix()
                if arc.startswith("..") or "__pycache__" in f.parts or arc.endswith(".pyc"):
                    continue  # the scripts pip wrote and the bytecode it compiled
                if arc.startswith(dist_info) and arc[len(dist_info) :] in leave:
                    continue
                data = Path(str(dist.locate_file(f))).read_bytes()
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                hashed = f"sha256={digest.decode()}"
                if f.hash is not None and f"{f.hash.mode}={f.hash.value}" != hashed:
                    raise WheelUnavailable(
                        f"the installed {arc} differs from what its RECORD says: "
                        "a modified install is not served"
                    )
                zf.writestr(arc, data)
                record.append((arc, hashed, str(len(data))))
            rows = io.StringIO()
            record.append((dist_info + "RECORD", "", ""))
            csv.writer(rows, lineterminator="\n").writerows(record)
            zf.writestr(dist_info + "RECORD", rows.getvalue())
        data = buf.getvalue()
        final = self.cache / f"installed-{hashlib.sha256(data).hexdigest()[:32]}" / name
        if not final.is_file():
            final.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=final.parent, delete=False) as tmp:
                tmp.write(data)
            os.replace(tmp.name, final)
        return final


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def commands(request: Request, wheel: str, *, token: bool) -> dict[str, str]:
    """The two commands for this host, as the volunteer reached it."""
    base = str(request.base_url).rstrip("/")
    ws = "wss" + base[5:] if base.startswith("https") else "ws" + base[4:]
    run = f"crowdgrad client {ws}/ws" + (" --token TOKEN" if token else "")
    return {"install": f"pipx install {base}/client/{wheel}", "run": run}


def add_routes(app: FastAPI, crowd: CrowdServer, wheel: ClientWheel | None = None) -> None:
    """``/client/``, ``/client/<wheel>`` and ``/api/client`` on ``app``."""
    source = wheel or ClientWheel()
    sha: dict[Path, str] = {}

    async def ready() -> Path:
        try:
            path = await asyncio.to_thread(source.path)
        except WheelUnavailable as exc:
            raise HTTPException(503, f"no client wheel: {exc}") from None
        if path not in sha:
            sha[path] = await asyncio.to_thread(file_sha256, path)
        return path

    @app.get("/api/client")
    async def api_client(request: Request) -> dict[str, Any]:
        """The desktop client for this coordinator: its version, the wheel's name and
        URL, and the commands that install and start it (``pipx install URL``, then
        ``crowdgrad client ws://HOST/ws``). ``available`` is false, with the
        reason, where no wheel can be made (the wheel itself is built on the first
        download, so this answers at once)."""
        found = source.origin()
        version = None if isinstance(found, str) else found.version
        out: dict[str, Any] = {"available": version is not None, "version": version}
        if version is None:
            out["reason"] = found
            return out
        name = wheel_name(version)
        out |= {"wheel": name, "url": f"client/{name}"}
        out |= commands(request, name, token=crowd.join_token is not None)
        return out

    @app.get("/client", include_in_schema=False)
    async def client_folder() -> RedirectResponse:
        return RedirectResponse("client/", status_code=308)

    @app.get("/client/", response_class=HTMLResponse)
    async def client_index(request: Request) -> HTMLResponse:
        """The wheel of this coordinator's version as a link with its sha256 (a page
        pip's ``--find-links`` reads), and the commands that install and start it.
        503 where no wheel can be made."""
        path = await ready()
        name = html.escape(path.name)
        cmds = commands(request, path.name, token=crowd.join_token is not None)
        body = (
            "<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>crowdgrad desktop client</title></head><body><h1>crowdgrad desktop client</h1>"
            f"<p><a href='{name}#sha256={sha[path]}'>{name}</a></p>"
            f"<pre>{html.escape(cmds['install'])}\n{html.escape(cmds['run'])}</pre></body></html>"
        )
        return HTMLResponse(body)

    @app.head("/client/{name}", include_in_schema=False)
    @app.get("/client/{name}")
    async def client_file(name: str) -> Response:
        """The wheel (``crowdgrad-<version>-py3-none-any.whl``; built on the first
        request, then kept in the cache)."""
        version = source.version
        if version is None or name != wheel_name(version):
            expected = "none" if version is None else wheel_name(version)
            raise HTTPException(404, f"no {name[:120]!r} here; this coordinator serves {expected}")
        path = await ready()
        headers = {"Digest": f"sha-256={base64.b64encode(bytes.fromhex(sha[path])).decode()}"}
        return FileResponse(path, media_type="application/octet-stream", headers=headers)
