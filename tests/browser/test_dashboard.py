"""The operator's dashboard in real Chromium: live numbers, charts drawn from the
run's history, one row per client, behind the admin token when one is set."""

from __future__ import annotations

import httpx

from coordinator.core import events as ev
from tests.browser.conftest import artifacts_dir
from tests.browser.test_volunteer_page import open_tab, page_url, wait_until
from tests.e2e.e2e_helpers import digits_job, running


def dash(page) -> dict:
    return page.evaluate("globalThis.dashboard") or {}


def test_the_dashboard_shows_the_run_live(context) -> None:
    job = digits_job(
        stop={"target_accuracy": 1.0, "max_versions": 100_000, "max_time_s": 300, "patience": 0}
    )
    with running(job, admin_token="adm") as (bg, service, rec):
        base = bg.url.replace("ws://", "http://").removesuffix("/ws")
        assert httpx.get(f"{base}/api/dashboard").status_code == 401
        ok = {"Authorization": "Bearer adm"}
        assert httpx.get(f"{base}/api/dashboard", headers=ok).json()["clients"] == []
        board = open_tab(context, f"{base}/dashboard")
        wait_until(lambda: board.is_visible("#auth"), 20, "the token form")
        board.fill("#token", "adm")
        board.click("#auth button")
        wait_until(lambda: dash(board).get("connected"), 20, "the stream")
        tabs = [open_tab(context, page_url(bg.url)) for _ in range(2)]
        # Two throughput samples (5 s apart) and several evaluations: the charts have lines.
        wait_until(lambda: len(rec.of(ev.Evaluated)) >= 4, 60, "evaluations")
        wait_until(lambda: len(service.history.throughput) >= 3, 30, "throughput samples")
        wait_until(lambda: dash(board).get("updates", 0) >= 3 and len(dash(board)["clients"]) == 2,
                   20, "the dashboard to catch up")  # fmt: skip
        d = dash(board)
        assert {c["kind"] for c in d["clients"]} == {"browser"}
        assert all(c["accepted"] > 0 and c["flops"] > 0 for c in d["clients"]), d["clients"]
        assert any(e["kind"] == "join" for e in d["events"])
        assert board.inner_text("#version") != "–" and int(board.inner_text("#version")) > 0
        assert board.inner_text("#accuracy").endswith("%")
        # the tasks' lr multiplier, and what sets it (here the crowd's concurrency alone)
        assert board.inner_text("#lr").startswith("×"), board.inner_text("#lr")
        assert board.inner_text("#lr-why").startswith("concurrency "), board.inner_text("#lr-why")
        assert board.locator("#clients-table tbody tr").count() == 2
        drawn = board.evaluate("[...document.querySelectorAll('.uplot canvas')].length")
        assert drawn == 4
        shot = artifacts_dir() / "dashboard.png"
        board.screenshot(path=str(shot), full_page=True)
        assert _chart_has_ink(shot, board.locator("#chart-version canvas").bounding_box())
        for tab in tabs:
            tab.close()
        # Tabs that leave show as gone, with their reason.
        wait_until(lambda: all(not c["connected"] for c in dash(board)["clients"]), 20, "leaves")


def _chart_has_ink(png, box: dict) -> bool:
    """The accuracy chart drew a line: its plot holds the series colour (#2f6fdb)."""
    from matplotlib import image

    img = image.imread(str(png))
    x0, y0 = int(box["x"]), int(box["y"])
    region = img[y0 : y0 + int(box["height"]), x0 : x0 + int(box["width"]), :3]
    blue = (abs(region[..., 0] - 0x2F / 255) < 0.08) & (abs(region[..., 2] - 0xDB / 255) < 0.08)
    return int(blue.sum()) > 50
