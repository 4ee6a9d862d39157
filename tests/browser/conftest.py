"""Real Chromium (Debian's, through ``executable_path``) driven by Playwright for
Python. Nothing downloads a browser: without /usr/bin/chromium (or
``CROWDGRAD_CHROMIUM``) the browser tests skip, which CI's
``CROWDGRAD_REQUIRE_ALL=1`` turns into a failure; ``.ci/run`` installs it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from client import WEB_ROOT

#: Flags for a machine with no network beyond loopback and no display: without
#: the background-networking ones Chromium keeps trying Google's hosts.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    # Hidden or occluded tabs would be throttled; several test tabs are all "visible".
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
]


def chromium_path() -> str | None:
    given = os.environ.get("CROWDGRAD_CHROMIUM")
    if given:
        return given
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="session")
def chromium() -> Iterator[object]:
    path = chromium_path()
    if path is None:
        pytest.skip("no chromium on this machine (Debian: apt-get install chromium)")
    if not (WEB_ROOT / "worker.js").is_file():
        pytest.fail("client/web/static is not built: run `make web`")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture()
def context(chromium: object) -> Iterator[object]:
    """A fresh profile per test: its own Cache API, so shards are fetched anew."""
    ctx = chromium.new_context(viewport={"width": 1000, "height": 900})  # type: ignore[attr-defined]
    try:
        yield ctx
    finally:
        ctx.close()


def artifacts_dir() -> Path:
    out = Path(os.environ.get("CROWDGRAD_ARTIFACTS", "build/browser"))
    out.mkdir(parents=True, exist_ok=True)
    return out
