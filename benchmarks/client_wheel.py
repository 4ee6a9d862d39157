"""From the volunteer page's command to a first accepted result (issue 36).

What a volunteer on a fresh machine does: the page's first command (``pipx install
http://HOST:PORT/client/<wheel>``: pipx makes a virtual environment and
pip-installs the URL into it, which this script does itself, pipx not being
needed to measure it) and its second (``crowdgrad client ws://HOST:PORT/ws``),
timed until the coordinator accepts that client's first result. Three runs:

- **cold**: an empty pip cache (every dependency downloaded from the index pip
  is configured with), a new environment, numba compiling the client's kernels;
- **warm**: pip's cache filled by the cold run, another new environment;
- **restart**: the warm run's client started again (its numba cache filled).

The coordinator is this checkout's, ``--no-store``, its wheel built before the
clock starts (the first request builds it: a one-off of the operator's). The
dependencies are constrained to the versions this environment runs, as in
tests/e2e/test_client_wheel.py.

    python benchmarks/client_wheel.py [--json]
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=300) as resp:
        return resp.read()


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return {**env, **extra}


def first_result(base: str, crowdgrad: Path, name: str, cwd: Path) -> float:
    """Start ``crowdgrad client``; seconds until the coordinator accepts its result."""
    t0 = time.monotonic()
    ws = base.replace("http://", "ws://") + "/ws"
    proc = subprocess.Popen(
        [str(crowdgrad), "client", ws, "--name", name, "-q"],
        env=clean_env(), cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        while True:
            rows = json.loads(get(f"{base}/api/dashboard"))["clients"]
            if any(r["name"] == name and r["accepted"] > 0 for r in rows):
                return time.monotonic() - t0
            if proc.poll() is not None:
                raise SystemExit(f"the client exited with {proc.returncode}")
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)


def install(url: str, home: Path, pip_cache: Path, constraints: Path) -> tuple[Path, float]:
    """The page's first command, as pipx runs it; the client's script and seconds."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(home / "venv")], check=True)
    pins = " ".join([str(constraints), *os.environ.get("PIP_CONSTRAINT", "").split()])
    subprocess.run(
        [str(home / "venv/bin/python"), "-m", "pip", "install", "--quiet", url],
        env=clean_env(PIP_CACHE_DIR=str(pip_cache), PIP_CONSTRAINT=pins), cwd=home,
        check=True, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return home / "venv/bin/crowdgrad", time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="crowdgrad-wheel-bench-"))
    constraints = work / "constraints.txt"
    pins = {}
    for d in md.distributions():
        if (n := d.metadata["Name"]) and n.lower() != "crowdgrad":
            pins.setdefault(n.lower(), f"{n}=={d.version}")
    constraints.write_text("\n".join(sorted(pins.values())) + "\n")
    env = {**os.environ, "CROWDGRAD_WHEEL_DIR": str(work / "wheels"), "COLUMNS": "200"}
    coord = subprocess.Popen(
        [sys.executable, "-m", "crowdgrad", "coordinator", "--port", "0", "--no-store",
         "--keep-running", "--widths", "64,16,10"],
        cwd=ROOT, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert coord.stdout is not None
        for line in coord.stdout:
            if m := re.search(r"ws://127\.0\.0\.1:(\d+)/ws", line):
                base = f"http://127.0.0.1:{m.group(1)}"
                break
        while True:
            try:
                info = json.loads(get(f"{base}/api/client"))
                break
            except OSError:
                time.sleep(0.1)
        t0 = time.monotonic()
        get(f"{base}/client/")  # the operator's one-off: the wheel is built
        build_s = time.monotonic() - t0
        url = info["install"].removeprefix("pipx install ")
        out: dict[str, float] = {"wheel_build_s": round(build_s, 2)}
        pip_cache = work / "pip-cache"
        for run in ("cold", "warm"):
            home = work / run
            home.mkdir()
            crowdgrad, install_s = install(url, home, pip_cache, constraints)
            result_s = first_result(base, crowdgrad, run, home)
            out[f"{run}_install_s"] = round(install_s, 2)
            out[f"{run}_first_result_s"] = round(result_s, 2)
            out[f"{run}_total_s"] = round(install_s + result_s, 2)
        out["restart_first_result_s"] = round(
            first_result(base, work / "warm/venv/bin/crowdgrad", "restart", work / "warm"), 2
        )
    finally:
        coord.send_signal(signal.SIGTERM)
        coord.wait(60)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:26s} {v:8.2f}")
    print(f"(left in {work}; remove it when done)", file=sys.stderr)


if __name__ == "__main__":
    main()
