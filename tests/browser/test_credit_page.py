"""Credit in real Chromium against a real coordinator (issue 36 item 2): a tab
makes its volunteer key once and keeps it in localStorage, sends it with the
name its volunteer chose, shows "your contribution" as /api/credit/{id} has it,
keeps the same volunteer across a reload, and the dashboard's leaderboard lists
it (docs/operations.md, "Credit")."""

from __future__ import annotations

import re

import httpx

from coordinator.core import events as ev
from protocol.volunteer import volunteer_id
from tests.browser.conftest import artifacts_dir
from tests.browser.test_dashboard import dash
from tests.browser.test_volunteer_page import open_tab, page_url, stats, wait_until
from tests.e2e.e2e_helpers import digits_job, running

OPEN_ENDED = {"target_accuracy": None, "max_versions": 1_000_000, "max_time_s": None, "patience": 0}
UNITS = {"FLOP": 1.0, "kFLOP": 1e3, "MFLOP": 1e6, "GFLOP": 1e9, "TFLOP": 1e12}


def shown_flops(text: str) -> float:
    """``12.3 MFLOP`` → 12.3e6."""
    match = re.fullmatch(r"([0-9.]+) ([kMGT]?FLOP)", text.strip())
    assert match, f"not a number of FLOPs: {text!r}"
    return float(match[1]) * UNITS[match[2]]


def credit(page) -> dict:
    return page.evaluate("globalThis.crowdgrad.credit")


def test_a_tab_earns_credit_under_its_key_across_a_reload_and_leads_the_board(context) -> None:
    with running(digits_job(stop=OPEN_ENDED)) as (bg, _service, rec):
        api = bg.url.replace("ws://", "http://").removesuffix("/ws")
        page = open_tab(context, page_url(bg.url, "autostart=0"))
        assert re.fullmatch(r"tab-[0-9a-f]{4}", page.input_value("#name"))
        assert "Join to earn credit" in page.inner_text("#credit-note")
        key = page.evaluate("localStorage.getItem('crowdgrad-volunteer-key')")
        assert re.fullmatch(r"[A-Za-z0-9_-]{43}", key)
        # A name the coordinator would refuse (a bidi override) is refused here first.
        page.fill("#name", "Ada\u202eLovelace")
        page.click("#join")
        assert "printable characters only (not U+202E)" in page.inner_text("#name-note")
        assert page.evaluate("globalThis.crowdgrad.joined") is False
        page.fill("#name", "Ada Lovelace")
        page.click("#join")
        wait_until(lambda: stats(page).get("accepted", 0) >= 5, 60, "five accepted results")
        vid = stats(page)["volunteer"]
        assert vid == volunteer_id(key), (vid, key)
        assert page.evaluate("localStorage.getItem('crowdgrad-volunteer-name')") == "Ada Lovelace"

        # Stopped, the tab's credit is final: the page shows what the API says.
        page.click("#leave")
        wait_until(lambda: stats(page).get("status") == "left", 20, "the tab to leave")
        tab_ids = {j.client_id for j in rec.of(ev.ClientJoined) if j.name == "Ada Lovelace"}
        assert tab_ids, "the tab joined under its display name"

        def settled() -> dict | None:
            acct = httpx.get(f"{api}/api/credit/{vid}").json()
            ours = [a for a in rec.of(ev.ResultAccepted) if a.client_id in tab_ids]
            shown = credit(page)["account"]
            same = shown is not None and (shown["flops"], shown["results"]) == (
                acct["flops"],
                acct["results"],
            )
            return acct if same and acct["results"] == len(ours) else None

        acct = wait_until(settled, 30, "the page to show the final credit")
        assert acct["name"] == "Ada Lovelace" and acct["rank"] == 1 and acct["flops"] > 0
        assert acct["pending_flops"] == 0 and not acct["excluded"]
        flops_text = page.inner_text("#credit-flops")
        assert abs(shown_flops(flops_text) - acct["flops"]) <= 0.005 * acct["flops"], flops_text
        assert page.inner_text("#credit-results") == f"{acct['results']:,}"
        assert page.inner_text("#credit-rank") == "1 of 1"
        assert page.inner_text("#credit-id") == vid
        assert not page.is_visible("#credit-pending")
        page.screenshot(path=str(artifacts_dir() / "credit-page.png"), full_page=True)

        # Reloaded: the same key and name, so the same volunteer, and its credit adds up.
        page.reload()
        assert page.input_value("#name") == "Ada Lovelace"
        assert page.evaluate("localStorage.getItem('crowdgrad-volunteer-key')") == key
        page.click("#join")
        wait_until(lambda: stats(page).get("volunteer") == vid, 30, "the same volunteer id")
        wait_until(lambda: stats(page).get("accepted", 0) >= 3, 60, "results after the reload")
        before = acct["results"]
        wait_until(lambda: (credit(page)["account"] or {}).get("results", 0) > before, 30,
                   "the page's credit to grow past the first visit's")  # fmt: skip
        page.click("#leave")
        wait_until(lambda: stats(page).get("status") == "left", 20, "the tab to leave again")
        tab_ids = {j.client_id for j in rec.of(ev.ClientJoined) if j.name == "Ada Lovelace"}
        acct = wait_until(settled, 30, "the page to show the credit of both visits")
        assert len(tab_ids) >= 2 and acct["results"] > before

        # The dashboard's leaderboard lists it, and its client rows say browser.
        board = open_tab(context, f"{api}/dashboard")
        wait_until(lambda: (dash(board).get("credit") or {}).get("total") == 1, 20, "the board")
        top = dash(board)["credit"]["volunteers"][0]
        assert (top["volunteer"], top["name"], top["flops"]) == (vid, "Ada Lovelace", acct["flops"])
        row = board.locator(f'#leaderboard tr[data-volunteer="{vid}"] td')
        assert row.nth(0).inner_text() == "1"
        assert row.nth(1).inner_text().splitlines() == ["Ada Lovelace", vid]
        assert row.nth(2).inner_text() == page.inner_text("#credit-flops")
        assert row.nth(3).inner_text() == f"{acct['results']:,}"
        assert "1 volunteer" in board.inner_text("#leaderboard-summary")
        wait_until(lambda: len(dash(board).get("clients", [])) >= 2, 20, "the client rows")
        kinds = {c["kind"] for c in dash(board)["clients"] if c["name"] == "Ada Lovelace"}
        assert kinds == {"browser"}, dash(board)["clients"]
        board.screenshot(path=str(artifacts_dir() / "credit-dashboard.png"), full_page=True)
