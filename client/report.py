"""What the desktop client tells its person, in sentences: when it joined, what it
does (a progress line), why it cannot connect, and why it left, with its totals.

Theory of operation. ``DesktopClient`` counts into a :class:`Tally` (tasks, acks
by reason, bytes each way) and hands finished sentences to a :class:`Reporter`:
``say`` (joined, the model, left), ``problem`` (cannot connect, refused, lost)
and ``progress`` (the line of counts, every ``progress_interval`` seconds once
joined). The sentences are made here by pure functions of the counts and the
failures, so they are tested without sockets. :class:`LogReporter`, the default
for a client inside another program (``crowdgrad.serve``), logs them; the command
line's reporter prints them (crowdgrad.commands.client).

A failure becomes a :class:`Failure`, one sentence and a verdict: ``fatal`` where
retrying cannot help (an untrusted certificate or another TLS error, an HTTP 4xx
answer to the websocket upgrade, a host name that does not exist before the
first join, a refusal by the coordinator: join token, protocol version, an
excluded client), else the client retries with backoff (connection refused, a
timeout, a busy or restarting server, a lost connection).
"""

from __future__ import annotations

import logging
import math
import socket
import ssl
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from websockets.exceptions import (
    ConnectionClosed,
    InvalidHandshake,
    InvalidStatus,
    InvalidURI,
)
from websockets.uri import parse_uri

from protocol import messages as m
from protocol.errors import CLOSE_CODES, ErrorCode
from protocol.limits import PROFILES, LinkLimits

log = logging.getLogger(__name__)

#: Error code per close code the coordinator sends (docs/protocol.md §7).
ERROR_OF_CLOSE: dict[int, ErrorCode] = {close: code for code, close in CLOSE_CODES.items()}

#: HTTP answers to the upgrade that a retry may get past (busy, restarting).
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


class Reporter(Protocol):
    """Where the client's sentences go; see the module docstring."""

    #: seconds between progress lines (0: none)
    progress_interval: float

    def say(self, text: str) -> None: ...

    def problem(self, text: str) -> None: ...

    def progress(self, text: str) -> None: ...


class LogReporter:
    """The sentences as log records (``client.report`` logger): INFO, problems at
    WARNING."""

    def __init__(self, progress_interval: float = 30.0) -> None:
        self.progress_interval = progress_interval

    def say(self, text: str) -> None:
        log.info("%s", text)

    def problem(self, text: str) -> None:
        log.warning("%s", text)

    def progress(self, text: str) -> None:
        log.info("%s", text)


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a connection failed or ended, in a sentence; ``fatal``: retrying cannot help."""

    text: str
    fatal: bool = False


@dataclass(slots=True)
class Tally:
    """What this client did, counted by its driver (``now`` values: its clock)."""

    started: float
    #: the first welcome, and how many welcomes (connections that joined)
    joined_at: float | None = None
    joins: int = 0
    #: results computed and sent
    tasks: int = 0
    #: acks: accepted (a ``duplicate`` is in the model once, so it counts here too)
    #: and refused, by reason word (docs/protocol.md §3.6)
    accepted: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    #: tasks this client declined (the session's count)
    declined: int = 0
    #: websocket frame bytes each way
    bytes_down: int = 0
    bytes_up: int = 0
    #: the model version of the newest task
    version: int | None = None

    def ack(self, ack: m.Ack) -> None:
        if ack.accepted or ack.reason == "duplicate":
            self.accepted += 1
        else:
            self.refused[ack.reason or "refused"] += 1


# -- words -----------------------------------------------------------------------------


def size_text(n: float) -> str:
    """Bytes in decimal units: ``512 B``, ``19.2 kB``, ``1.3 MB``."""
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("kB", "MB", "GB", "TB"):
        n /= 1000
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def duration_text(seconds: float) -> str:
    """``4.2 s``, ``3 min 5 s``, ``2 h 10 min``."""
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"


def link_text(limits: LinkLimits) -> str:
    """The granted link: its profile's name where it is one, and its rates."""
    name = next((k for k, v in PROFILES.items() if v == limits), None)
    if math.isinf(limits.bytes_per_s):
        rate = "no rate limit"
    else:
        rate = f"{size_text(limits.bytes_per_s)}/s, {limits.messages_per_s:,.0f} messages/s"
    return f"link {name} ({rate})" if name else f"link {rate}"


def refused_text(refused: Counter[str]) -> str:
    n = sum(refused.values())
    if not n:
        return "none refused"
    why = ", ".join(f"{r} {k}" for r, k in refused.most_common())
    return f"{n} refused ({why})"


def joined_sentence(
    url: str,
    welcome: m.Welcome,
    *,
    name: str,
    cpu_share: float,
    priority: str,
    again: bool = False,
) -> str:
    job = f"job '{welcome.job}'" if welcome.job else "the job"
    verb = "joined again (session resumed):" if again else "joined"
    share = f"{cpu_share * 100:.0f} %"
    return (
        f"{verb} {job} at {url} as client {welcome.session_id} (name {name}); "
        f"{link_text(welcome.limits)}; CPU share {share} at {priority} priority"
    )


def model_sentence(task: m.Task) -> str:
    spec = task.spec
    n = spec.num_params
    widths = ", ".join(str(w) for w in spec.widths)
    what = "model" if task.subnet is None else "sub-model tasks: a subnet"
    return (
        f"{what} [{widths}]: {n:,} parameters ({size_text(4 * n)} as float32); "
        f"tasks of {task.steps} steps of batch {task.batch} on {task.dataset}"
    )


def progress_line(t: Tally, now: float) -> str:
    version = "no model yet" if t.version is None else f"model v{t.version}"
    since = t.joined_at if t.joined_at is not None else t.started
    minutes = (now - since) / 60
    rate = f"{t.tasks / minutes:.1f} results/min" if minutes * 60 >= 1 else "— results/min"
    declined = f", {t.declined} declined" if t.declined else ""
    return (
        f"{version}: {t.tasks} tasks done, {t.accepted} accepted, "
        f"{refused_text(t.refused)}{declined}; {rate}; {size_text(t.bytes_down)} down, "
        f"{size_text(t.bytes_up)} up"
    )


def summary(t: Tally, why: str, now: float) -> str:
    """The leaving sentence: why, then the totals."""
    if t.joined_at is None:
        return f"left after {duration_text(now - t.started)}: {why}; it never joined"
    version = "" if t.version is None else f"; last model v{t.version}"
    joins = f"; {t.joins} connections" if t.joins > 1 else ""
    return (
        f"left after {duration_text(now - t.started)}: {why}. {t.tasks} tasks done, "
        f"{t.accepted} accepted, {refused_text(t.refused)}, {t.declined} declined; "
        f"{size_text(t.bytes_down)} down, {size_text(t.bytes_up)} up{version}{joins}"
    )


# -- failures ----------------------------------------------------------------------------


def close_failure(code: int | None, reason: str) -> Failure:
    """The coordinator closed the connection with ``code``: what that means here."""
    said = f": {reason}" if reason else ""
    error = ERROR_OF_CLOSE.get(code) if code is not None else None
    if error is ErrorCode.AUTH_FAILED:
        return Failure(
            "the coordinator refused this client's join token (give the right one "
            f"with --token or $CROWDGRAD_JOIN_TOKEN){said}",
            fatal=True,
        )
    if error is ErrorCode.UNSUPPORTED_VERSION:
        return Failure(
            "the coordinator does not speak this client's protocol version; install "
            f"the crowdgrad version it runs{said}",
            fatal=True,
        )
    if error is ErrorCode.BAD_FIELD:
        return Failure(f"the coordinator refused this client{said}", fatal=True)
    if error is ErrorCode.REPLACED:
        return Failure(
            "another connection resumed this client's session, which goes on there "
            f"(close {code}){said}",
            fatal=True,
        )
    if code is None or code == 1006:
        return Failure("the connection to the coordinator was lost")
    if error is ErrorCode.SHUTTING_DOWN:
        return Failure(f"the coordinator is shutting down (close {code}{said})")
    name = f" {error.name}" if error is not None else ""
    return Failure(f"the coordinator closed the connection (close {code}{name}{said})")


def connect_failure(exc: BaseException, url: str, *, joined: bool = False) -> Failure:
    """A connection to ``url`` could not open: why, for a person. ``joined``: this
    client joined before (a name that stops resolving then is the network's
    trouble, not a typo)."""
    try:
        uri = parse_uri(url)
        where = f"{uri.host}:{uri.port}"
    except InvalidURI:
        where = url
    cannot = f"cannot connect to {url}"
    if isinstance(exc, InvalidURI):
        return Failure(f"{url} is not a websocket URL (ws://host:port/ws or wss://…)", True)
    if isinstance(exc, ssl.SSLCertVerificationError):  # before OSError: it is one
        return Failure(
            f"{cannot}: its TLS certificate is not trusted ({exc.verify_message}); for a "
            "coordinator with its own certificate pass --ca PEM",
            fatal=True,
        )
    if isinstance(exc, ssl.SSLError):
        return Failure(
            f"{cannot}: the TLS handshake failed ({getattr(exc, 'reason', None) or exc}); "
            "is it a wss:// server, and is this the right port?",
            fatal=True,
        )
    if isinstance(exc, socket.gaierror):
        missing = exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", None))
        return Failure(
            f"{cannot}: the host name {where.rsplit(':', 1)[0]!r} does not resolve "
            f"({exc.strerror})",
            fatal=missing and not joined,
        )
    if isinstance(exc, ConnectionRefusedError):
        return Failure(f"{cannot}: connection refused (nothing listens on {where}; is the "
                       "coordinator running?)")  # fmt: skip
    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        phrase = exc.response.reason_phrase
        if status in RETRY_STATUSES:
            return Failure(f"{cannot}: the server answered HTTP {status} {phrase} (busy or "
                           "restarting)")  # fmt: skip
        hint = {
            401: "it asks for credentials this client does not send",
            403: "a proxy or firewall in front of it, or a wrong URL?",
            404: "is the path right? a crowdgrad coordinator's is /ws",
        }.get(status, "is this a crowdgrad coordinator's websocket URL?")
        return Failure(f"{cannot}: the server answered HTTP {status} {phrase} ({hint})", True)
    if isinstance(exc, InvalidHandshake):
        return Failure(f"{cannot}: the server did not answer as a websocket server ({exc})")
    if isinstance(exc, TimeoutError):
        return Failure(f"{cannot}: no answer from {where} in time")
    if isinstance(exc, ConnectionClosed):
        code = exc.rcvd.code if exc.rcvd is not None else None
        return close_failure(code, exc.rcvd.reason if exc.rcvd is not None else "")
    if isinstance(exc, OSError):
        return Failure(f"{cannot}: {exc.strerror or exc}")
    return Failure(f"{cannot}: {exc}")
