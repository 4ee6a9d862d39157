"""What both Python clients take from client.base: which closes end them, the
backoff, the join token and kernel family in hello, the CA option."""

from __future__ import annotations

import pytest

from client.base import FATAL_CLOSE_CODES, Backoff, ClientBase, tls_context
from client.report import close_failure
from client.session import ClientSession
from protocol import messages as m
from protocol.errors import CLOSE_CODES, ErrorCode


def test_a_replaced_session_is_a_fatal_close_and_the_console_says_so_alike() -> None:
    assert CLOSE_CODES[ErrorCode.REPLACED] in FATAL_CLOSE_CODES
    for code in CLOSE_CODES.values():
        assert close_failure(code, "").fatal == (code in FATAL_CLOSE_CODES), code


def test_backoff_doubles_with_full_jitter_starts_again_after_a_join_and_gives_up() -> None:
    b = Backoff(base=1.0, cap=5.0, seed=3, max_attempts=3)
    delays = [b.next(joined=False) for _ in range(3)]
    assert b.attempt == 3
    assert all(d is not None and 0 <= d <= cap for d, cap in zip(delays, (2, 4, 5), strict=True))
    assert b.next(joined=False) is None  # the fourth failure in a row
    assert b.next(joined=True) is not None and b.attempt == 1
    with pytest.raises(ValueError, match="backoff"):
        Backoff(base=2.0, cap=1.0, seed=0)


def test_the_join_token_and_the_kernel_family_travel_in_hello() -> None:
    base = ClientBase(
        "ws://x/ws", token="sesame", seed=0, backoff_base=0.1, backoff_cap=1.0, clock=lambda: 0.0
    )
    caps = base._capabilities(flops=1e9, cores=1, platform="test", prefetch=True, data=True)
    (send,) = ClientSession("c", caps).start(0.0)
    hello = m.decode(send.frame)
    assert isinstance(hello, m.Hello) and hello.token == "sesame"
    # the kernel family its tasks run on (client.compute), for replication (§3.1)
    assert hello.kernel == "numba-f32" and hello.kernel in m.KERNELS


def test_a_ca_is_for_wss_urls_only() -> None:
    assert tls_context("ws://x/ws", None) is None
    with pytest.raises(ValueError, match="ca: ws://x/ws is not a wss:// URL"):
        tls_context("ws://x/ws", "ca.pem")
    with pytest.raises(ValueError, match=r"ca missing\.pem"):
        tls_context("wss://x/ws", "missing.pem")
