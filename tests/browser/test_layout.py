"""Both pages at a desktop's 1280×800 and a phone's 390×844 in real Chromium,
against a real coordinator with real clients (issue 36 item 5): no element's
text or content leaves its box (credit too: the volunteer page's "your
contribution" and the dashboard's leaderboard, with the longest names), the
dashboard's recent events are not a wall of evaluations, and the volunteer page
draws the crowd's accuracy as a curve.
Screenshots of each page at each size go to pytest's tmp dir; a failure names
them."""

from __future__ import annotations

import json
from pathlib import Path

from coordinator.core import events as ev
from tests.browser.test_dashboard import _chart_has_ink, dash
from tests.browser.test_volunteer_page import open_tab, page_url, wait_until
from tests.e2e.e2e_helpers import clients, digits_job, running

VIEWPORTS = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}
#: The widest display names a volunteer may choose (32 characters, no space to
#: wrap at): the leaderboard and "your contribution" must hold them.
LONG_NAME = "W" * 32
LONG_TAB_NAME = "\U0001f642" * 32  # 🙂: wide glyphs, 32 code points, 64 UTF-16 units


def name_the_tabs(context, name: str) -> None:
    """Every page of ``context`` finds ``name`` as its volunteer's display name."""
    context.add_init_script(f"localStorage.setItem('crowdgrad-volunteer-name', {json.dumps(name)})")


#: Every rendered element whose content is wider or taller than its box, where
#: the box does not scroll (overflow visible, hidden or clip: the content spills
#: over its neighbours or is cut off), and the page itself when it scrolls
#: sideways. Skipped: scroll containers (scrolling is their job; what they hold
#: is still checked), inline boxes (their block's scroll size has their text),
#: and SVG's inner shapes (no client box). 1 px of slack for subpixel layout.
OVERFLOWS = """
() => {
  const scrolls = (v) => v === "auto" || v === "scroll";
  const classes = (el) => typeof el.className === "string" && el.className.trim()
    ? "." + el.className.trim().split(/\\s+/).join(".") : "";
  const name = (el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") + classes(el);
  const found = [];
  for (const el of [document.body, ...document.body.querySelectorAll("*")]) {
    if (el.getClientRects().length === 0) continue;  // not rendered
    if (el instanceof SVGElement && !(el instanceof SVGSVGElement)) continue;
    const cs = getComputedStyle(el);
    if (cs.display === "inline" || cs.display === "contents") continue;
    if (cs.visibility !== "visible") continue;
    const wide = !scrolls(cs.overflowX) && el.scrollWidth > el.clientWidth + 1;
    const tall = !scrolls(cs.overflowY) && el.scrollHeight > el.clientHeight + 1;
    if (!wide && !tall) continue;
    let path = name(el);
    for (let p = el.parentElement; p && p !== document.documentElement; p = p.parentElement) {
      path = name(p) + " > " + path;
    }
    found.push({element: path, text: (el.textContent || "").trim().slice(0, 60),
                scroll: [el.scrollWidth, el.scrollHeight],
                client: [el.clientWidth, el.clientHeight]});
  }
  const doc = document.documentElement;
  if (doc.scrollWidth > doc.clientWidth + 1) {
    found.push({element: "the page (scrolls sideways)", text: "",
                scroll: [doc.scrollWidth, 0], client: [doc.clientWidth, 0]});
  }
  return found;
}
"""


def overflows_at_each_size(page, name: str, out: Path, ready) -> tuple[list[str], list[Path]]:
    """Resize ``page`` to each viewport, wait for ``ready(page)`` (charts redrawn
    to the new width, say), screenshot it, and list what overflows."""
    problems, shots = [], []
    for size, viewport in VIEWPORTS.items():
        page.set_viewport_size(viewport)
        wait_until(lambda: ready(page), 20, f"{name} laid out at {size}")
        shot = out / f"{name}-{size}.png"
        page.screenshot(path=str(shot), full_page=True)
        shots.append(shot)
        problems += [f"{name} at {size}: {o}" for o in page.evaluate(OVERFLOWS)]
    return problems, shots


def charts_fit(page) -> bool:
    """Every uPlot chart has been resized to its box (ResizeObserver ran)."""
    return page.evaluate(
        "[...document.querySelectorAll('.uplot')]"
        ".every(u => u.parentElement.clientWidth >= u.offsetWidth)"
    )


def test_the_overflow_check_finds_what_overflows_and_only_that(chromium) -> None:
    """The check itself, on boxes made to overflow and boxes that may: text too
    wide for a card (the dashboard's "time left" was one), content too tall for
    a fixed height, a clipped one, and a sideways-scrolling page are found; a
    scroll container, text that wraps and an inline span are not."""
    page = chromium.new_page(viewport={"width": 390, "height": 844})  # type: ignore[attr-defined]
    try:
        nowrap = "white-space: nowrap"
        page.set_content(f"""
          <div id="card" style="width: 120px"><b style="{nowrap}">12 min (target_accuracy)</b></div>
          <div id="tall" style="height: 10px; line-height: 20px">a line taller than its box</div>
          <div id="clipped" style="width: 80px; overflow: hidden; {nowrap}">cut off, unseen</div>
          <div id="scroller" style="width: 100px; overflow-x: auto">
            <table><tr><td style="{nowrap}">a wide table in a box that scrolls</td></tr></table>
          </div>
          <div id="wraps" style="width: 100px">words that wrap onto lines of their own</div>
          <p style="width: 100px; overflow-wrap: anywhere">crowdgrad-web/0.1-joined-as-c12345</p>
        """)
        found = {o["element"].split(" > ")[-1] for o in page.evaluate(OVERFLOWS)}
        assert found == {"div#card", "div#tall", "div#clipped"}, found
        page.set_content('<div style="width: 500px">wider than a phone</div>')
        found = {o["element"] for o in page.evaluate(OVERFLOWS)}
        assert found == {"body", "the page (scrolls sideways)"}, found
    finally:
        page.close()


def test_the_dashboard_fits_a_desktop_and_a_phone_and_its_events_are_not_evaluations(
    context, tmp_path: Path
) -> None:
    """Mid-run (paused, so every size sees the same numbers, "time left" among
    them) and after the end, at both sizes: nothing overflows. The run makes
    dozens of evaluations (hundreds at the default cadence, fewer where the
    coordinator caps their share of its time); the events list shows every join
    and leave and the end, and its evaluation lines are the fewer."""
    job = digits_job(stop={"target_accuracy": 1.0, "max_versions": 3000, "max_time_s": 300})
    name_the_tabs(context, LONG_TAB_NAME)
    with running(job) as (bg, service, rec), clients(bg.url, [LONG_NAME]):
        base = bg.url.replace("ws://", "http://").removesuffix("/ws")
        board = open_tab(context, f"{base}/dashboard")
        tabs = [open_tab(context, page_url(bg.url)) for _ in range(2)]
        wait_until(lambda: len(rec.of(ev.Evaluated)) >= 40, 120, "40 evaluations")
        service.set_paused(True)
        wait_until(lambda: (dash(board).get("left") or {}).get("seconds") is not None
                   and len(dash(board).get("clients", [])) == 3 and dash(board)["status"]["paused"],
                   30, "the dashboard to show the paused run and its time left")  # fmt: skip
        # The leaderboard: the desktop client and the tabs (one browser profile: one volunteer).
        leaders = lambda: (dash(board).get("credit") or {}).get("volunteers", [])  # noqa: E731
        wait_until(lambda: {v["name"] for v in leaders()} == {LONG_NAME, LONG_TAB_NAME}, 30,
                   "the leaderboard's two volunteers")  # fmt: skip
        assert board.locator("#leaderboard tbody tr").count() == 2
        problems, shots = overflows_at_each_size(board, "dashboard-training", tmp_path, charts_fit)
        service.set_paused(False)
        assert rec.wait_for(lambda: bool(rec.of(ev.JobFinished)), timeout=280)
        for tab in tabs:
            tab.close()
        joins, leaves = len(rec.of(ev.ClientJoined)), 3
        wait_until(lambda: len(rec.of(ev.ClientLeft)) >= leaves, 60, "the three to leave")
        wait_until(lambda: sum(e["kind"] == "leave" for e in dash(board)["events"]) >= leaves,
                   30, "the dashboard to show the leaves")  # fmt: skip
        more, end_shots = overflows_at_each_size(board, "dashboard-finished", tmp_path, charts_fit)
        problems += more
        shots += end_shots
        assert not problems, f"{problems}; screenshots: {[str(s) for s in shots]}"

        lines = board.evaluate(
            "[...document.querySelectorAll('#events li')].map(li => [li.className, li.textContent])"
        )
        kinds = [k for k, _ in lines]
        evaluations = len(rec.of(ev.Evaluated))
        evaluation_lines = kinds.count("evaluated")
        paths = [str(s) for s in shots]
        shown = f"{evaluations} evaluations; the list: {lines}; screenshots: {paths}"
        assert kinds.count("join") == joins and kinds.count("leave") >= leaves, shown
        assert kinds.count("finished") == 1, shown
        assert 1 <= evaluation_lines <= evaluations / 10, shown
        assert evaluation_lines < len(kinds) - evaluation_lines, shown


def test_the_volunteer_page_fits_a_desktop_and_a_phone_and_draws_the_crowd_curve(
    context, tmp_path: Path
) -> None:
    """A tab opened before the first evaluation, beside a desktop client, draws
    the run's accuracy as a line from the points it polls; paused after a few
    dozen evaluations, at both sizes, nothing on it overflows."""
    job = digits_job(
        stop={"target_accuracy": 1.0, "max_versions": 100_000, "max_time_s": 300, "patience": 0}
    )
    name_the_tabs(context, LONG_TAB_NAME)
    with running(job) as (bg, service, rec), clients(bg.url, ["desktop-0"]):
        page = open_tab(context, page_url(bg.url))
        points = lambda: len(page.evaluate("globalThis.crowdgrad.curve.t"))  # noqa: E731
        wait_until(lambda: len(rec.of(ev.Evaluated)) >= 30 and points() >= 30, 120, "30 points")
        service.set_paused(True)
        wait_until(lambda: page.inner_text("#accuracy").endswith("%"), 30, "an accuracy shown")
        # "Your contribution" filled in: credit, results, a rank of two volunteers, the id.
        assert page.input_value("#name") == LONG_TAB_NAME
        wait_until(lambda: page.inner_text("#credit-flops").endswith("FLOP")
                   and page.inner_text("#credit-rank").endswith("of 2"),
                   30, "your contribution")  # fmt: skip
        problems, shots = overflows_at_each_size(page, "volunteer", tmp_path, charts_fit)
        assert not problems, f"{problems}; screenshots: {[str(s) for s in shots]}"
        # The curve: every evaluation the coordinator kept, drawn as a line.
        wait_until(lambda: points() == len(service.history.evaluations), 10, "the last points")
        curve = page.evaluate("globalThis.crowdgrad.curve")
        assert curve["t"] == sorted(curve["t"]) and all(0 <= a <= 1 for a in curve["accuracy"])
        box = page.locator("#crowd-curve canvas").bounding_box()
        assert box is not None and box["width"] > 300, box
        assert _chart_has_ink(shots[-1], box), f"no line in the crowd curve: {shots[-1]}"
