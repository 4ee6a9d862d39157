"""``crowdgrad client``'s console (crowdgrad/commands/client.py): where each kind of
sentence goes, on a terminal and off one, and what ``--quiet`` keeps."""

from __future__ import annotations

import io
import re

from rich.console import Console

from crowdgrad.cli import build_parser
from crowdgrad.commands.client import ConsoleReporter

STAMP = r"\d\d:\d\d:\d\d "


def consoles(terminal: bool) -> tuple[Console, io.StringIO, Console, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    return (
        Console(file=out, force_terminal=terminal, width=200),
        out,
        Console(file=err, force_terminal=terminal, width=200),
        err,
    )


def test_off_a_terminal_every_line_is_plain_with_its_time() -> None:
    o, out, e, err = consoles(terminal=False)
    r = ConsoleReporter(out=o, err=e)
    assert r.progress_interval == 30.0
    r.say("joined job 'digits'")
    r.progress("model v3: 2 tasks done")
    r.problem("cannot connect to ws://x/ws: connection refused")
    r.close()
    lines = out.getvalue().splitlines()
    assert re.fullmatch(STAMP + "joined job 'digits'", lines[0])
    assert re.fullmatch(STAMP + "model v3: 2 tasks done", lines[1])
    assert re.fullmatch(STAMP + "cannot connect to ws://x/ws: connection refused\n", err.getvalue())


def test_quiet_keeps_only_the_problems() -> None:
    o, out, e, err = consoles(terminal=False)
    r = ConsoleReporter(quiet=True, out=o, err=e)
    assert r.progress_interval == 0.0
    r.say("joined")
    r.progress("model v3")
    r.problem("refused")
    assert out.getvalue() == "" and "refused" in err.getvalue()


def test_on_a_terminal_the_progress_line_is_live_and_goes_away() -> None:
    o, out, e, _ = consoles(terminal=True)
    r = ConsoleReporter(out=o, err=e, interval=2.5)
    assert r.progress_interval == 2.5
    r.say("joined")
    r.progress("model v1: 1 tasks done")
    r.progress("model v2: 2 tasks done")
    r.close()
    r.say("left after 3.0 s")
    text = out.getvalue()
    assert "model v2: 2 tasks done" in text and not re.search(STAMP, text)
    assert text.index("joined") < text.index("left after")


def test_the_client_command_takes_quiet_and_progress_interval() -> None:
    args = build_parser().parse_args(["client", "ws://x/ws", "-q", "--progress-interval", "5"])
    assert args.quiet is True and args.progress_interval == 5.0
    args = build_parser().parse_args(["client", "ws://x/ws"])
    assert args.quiet is False and args.progress_interval is None
