"""``crowdgrad client``'s console (crowdgrad/commands/client.py): where each kind of
sentence goes, on a terminal and off one, and what ``--quiet`` keeps."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

from rich.console import Console

from crowdgrad.cli import build_parser
from crowdgrad.commands.client import ConsoleReporter, PlainConsole, default_console

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


def test_off_a_terminal_the_plain_console_prints_what_rich_prints(capsys, monkeypatch) -> None:
    for var in ("TTY_COMPATIBLE", "FORCE_COLOR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("time.strftime", lambda fmt: "12:34:56")  # both stamp alike
    plain = ConsoleReporter()  # pytest's captured streams are not terminals
    assert isinstance(plain.out, PlainConsole) and isinstance(plain.err, PlainConsole)
    o, out, e, err = consoles(terminal=False)
    rich = ConsoleReporter(out=o, err=e)
    for r in (plain, rich):
        r.say("joined [bold]job[/] 'digits' at ws://127.0.0.1:9/ws")
        r.progress("model v3: 2 tasks done")
        r.problem("cannot connect: [Errno 111] refused")
        r.close()
    got = capsys.readouterr()
    assert got.out == out.getvalue() and got.err == err.getvalue()
    assert "[bold]job[/]" in got.out


def test_a_terminal_or_a_forced_one_gets_rich(monkeypatch) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert isinstance(default_console(), Console)
    monkeypatch.delenv("FORCE_COLOR")
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    assert isinstance(default_console(stderr=True), Console)


def test_a_client_off_a_terminal_starts_without_rich() -> None:
    code = (
        "import sys; from crowdgrad.cli import main;"
        "code = main(['client', 'ws://127.0.0.1:9/ws', '-q', '--max-attempts', '0']);"
        "print(code, sorted(m for m in sys.modules if m.split('.')[0] == 'rich'))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TTY_COMPATIBLE", "FORCE_COLOR")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.stdout.strip() == "1 []", out.stdout + out.stderr
    assert "gave up after 1 attempts" in out.stderr  # the problem still said, plainly
