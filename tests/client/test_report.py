"""The desktop client's sentences (client/report.py): pure functions of counts and
failures, so each is checked here without a socket."""

from __future__ import annotations

import socket
import ssl
from collections import Counter

import pytest
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosedError, InvalidStatus, InvalidURI
from websockets.frames import Close
from websockets.http11 import Response

from client.report import (
    Tally,
    close_failure,
    connect_failure,
    duration_text,
    joined_sentence,
    link_text,
    model_sentence,
    progress_line,
    size_text,
    summary,
)
from nn.spec import ModelSpec
from protocol import messages as m
from protocol.limits import LinkLimits, profile

URL = "ws://coord.example:8000/ws"


def test_sizes_and_durations_read_as_words() -> None:
    assert size_text(512) == "512 B"
    assert size_text(19_240) == "19.2 kB"
    assert size_text(1_300_000) == "1.3 MB"
    assert duration_text(4.21) == "4.2 s"
    assert duration_text(185) == "3 min 5 s"
    assert duration_text(7800) == "2 h 10 min"


def test_link_names_its_profile_or_its_rates() -> None:
    assert link_text(profile("roblox")) == "link roblox (50.0 kB/s, 30 messages/s)"
    own = LinkLimits(bytes_per_s=2000, messages_per_s=5, max_message_bytes=4096)
    assert link_text(own) == "link 2.0 kB/s, 5 messages/s"
    assert "no rate limit" in link_text(profile("unlimited"))


def test_joined_names_the_job_the_client_and_its_settings() -> None:
    w = m.Welcome(session_id="c7", limits=profile("lan"), job="digits")
    text = joined_sentence(URL, w, name="box-1", cpu_share=0.5, priority="idle")
    assert text == (
        f"joined job 'digits' at {URL} as client c7 (name box-1); link lan "
        "(125.0 MB/s, 10,000 messages/s); CPU share 50 % at idle priority"
    )
    older = m.Welcome(session_id="c8", limits=profile("lan"))  # a server that names no job
    again = joined_sentence(URL, older, name="b", cpu_share=1, priority="normal", again=True)
    assert again.startswith("joined again (session resumed): the job at")


def test_model_sentence_gives_its_size() -> None:
    spec = ModelSpec(widths=(64, 64, 10))
    task = m.Task(
        task_id="1", model_version=3, spec=spec, dataset="digits#0", steps=10, batch=16,
        base_version=3,
    )  # fmt: skip
    assert model_sentence(task) == (
        "model [64, 64, 10]: 4,810 parameters (19.2 kB as float32); "
        "tasks of 10 steps of batch 16 on digits#0"
    )


def test_progress_and_summary_count_acks_by_reason() -> None:
    t = Tally(started=0.0, joined_at=10.0, joins=1, version=12)
    for ack in (
        m.Ack(task_id="1", accepted=True),
        m.Ack(task_id="2", accepted=False, reason="duplicate"),  # in the model once
        m.Ack(task_id="3", accepted=False, reason="stale"),
        m.Ack(task_id="4", accepted=False, reason="stale"),
        m.Ack(task_id="5", accepted=False, reason="norm"),
    ):
        t.ack(ack)
    t.tasks, t.bytes_down, t.bytes_up = 5, 2_500_000, 40_000
    assert t.accepted == 2 and t.refused == Counter(stale=2, norm=1)
    assert progress_line(t, 70.0) == (
        "model v12: 5 tasks done, 2 accepted, 3 refused (stale 2, norm 1); "
        "5.0 results/min; 2.5 MB down, 40.0 kB up"
    )
    assert summary(t, "the job finished (max_versions)", 70.0) == (
        "left after 1 min 10 s: the job finished (max_versions). 5 tasks done, "
        "2 accepted, 3 refused (stale 2, norm 1), 0 declined; 2.5 MB down, 40.0 kB up; "
        "last model v12"
    )
    assert summary(Tally(started=0.0), "stopped (Ctrl-C)", 3.0) == (
        "left after 3.0 s: stopped (Ctrl-C); it never joined"
    )


def test_refusals_by_the_coordinator_are_fatal_and_say_why() -> None:
    token = close_failure(4007, "hello.token: join token refused")
    assert token.fatal and "join token" in token.text and "--token" in token.text
    version = close_failure(4004, "hello.version: 9 not served")
    assert version.fatal and "protocol version" in version.text and "9 not served" in version.text
    excluded = close_failure(4003, "excluded: disagrees")
    assert excluded.fatal and excluded.text.endswith("refused this client: excluded: disagrees")
    replaced = close_failure(4018, "a newer connection resumed this session")
    assert replaced.fatal and "goes on there" in replaced.text
    timeout = close_failure(4014, "no message for 15 s")
    assert not timeout.fatal
    assert timeout.text == (
        "the coordinator closed the connection (close 4014 TIMEOUT: no message for 15 s)"
    )
    assert not close_failure(1001, "").fatal and "shutting down" in close_failure(1001, "").text
    assert close_failure(1006, "").text == "the connection to the coordinator was lost"


def _status(code: int, phrase: str) -> InvalidStatus:
    return InvalidStatus(Response(code, phrase, Headers()))


@pytest.mark.parametrize(
    ("exc", "words", "fatal"),
    [
        (ConnectionRefusedError(111, "Connection refused"), "connection refused (nothing "
         "listens on coord.example:8000; is the coordinator running?)", False),
        (socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
         "the host name 'coord.example' does not resolve (Name or service not known)", True),
        (socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"),
         "does not resolve (Temporary failure", False),
        (_status(404, "Not Found"), "HTTP 404 Not Found (is the path right?", True),
        (_status(403, "Forbidden"), "HTTP 403 Forbidden (a proxy or firewall", True),
        (_status(503, "Service Unavailable"), "HTTP 503 Service Unavailable (busy", False),
        (TimeoutError(), "no answer from coord.example:8000 in time", False),
        (ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"),
         "the TLS handshake failed", True),
        (ConnectionClosedError(Close(4014, "late"), None), "close 4014 TIMEOUT: late", False),
        (OSError(113, "No route to host"), "No route to host", False),
    ],
)  # fmt: skip
def test_connect_failures_are_sentences(exc: BaseException, words: str, fatal: bool) -> None:
    f = connect_failure(exc, URL)
    assert f.text.startswith(f"cannot connect to {URL}: ") or "close" in f.text
    assert words in f.text and f.fatal is fatal


def test_an_untrusted_certificate_says_to_pass_ca() -> None:
    exc = ssl.SSLCertVerificationError(1, "certificate verify failed")
    exc.verify_message = "self-signed certificate"
    f = connect_failure(exc, "wss://coord.example/ws")
    assert f.fatal
    assert "its TLS certificate is not trusted (self-signed certificate)" in f.text
    assert "--ca PEM" in f.text


def test_a_name_that_stops_resolving_after_a_join_is_retried() -> None:
    exc = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    assert not connect_failure(exc, URL, joined=True).fatal


def test_a_bad_url_is_fatal() -> None:
    f = connect_failure(InvalidURI("http://x/ws", "scheme isn't ws or wss"), "http://x/ws")
    assert f.fatal and f.text.startswith("http://x/ws is not a websocket URL")
