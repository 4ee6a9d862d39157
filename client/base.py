"""What the Python clients do alike around a ClientSession.

client.desktop (asyncio and a compute thread) and client.ingame (a game's
frames) each own a socket, a clock and a way to compute; :class:`ClientBase`
owns the rest, once: hello's capabilities (the join token among them), the
close codes after which reconnecting cannot help, when to try again
(:class:`Backoff`), a frame from the coordinator to the session, the session's
actions to the driver's hooks, a compute's outcome back to the session, and the
``bye`` a stopping client says.
"""

from __future__ import annotations

import logging
import os
import random
import ssl
from collections.abc import Callable
from typing import assert_never

from client.actions import Action, Capabilities, Close, ComputeRequest, Finished, Send
from client.compute import KERNEL, ComputeOutput
from client.session import ClientSession, Phase
from compression import codecs
from nn.spec import INIT_SCHEME
from protocol import messages as m
from protocol.errors import CLOSE_CODES, ErrorCode, ProtocolError
from protocol.limits import LinkLimits

log = logging.getLogger(__name__)

#: Close codes after which reconnecting cannot help: the join token refused, the
#: protocol version or a hello field not served, and ``REPLACED`` (the session
#: lives on in a newer connection; reconnecting would take it back, §6).
FATAL_CLOSE_CODES = frozenset(
    CLOSE_CODES[c]
    for c in (
        ErrorCode.AUTH_FAILED,
        ErrorCode.UNSUPPORTED_VERSION,
        ErrorCode.BAD_FIELD,
        ErrorCode.REPLACED,
    )
)
#: Largest frame accepted from a coordinator (the "unlimited" profile + envelope).
MAX_FRAME_BYTES = 256 * 1024 * 1024 + 64 * 1024
#: What a stopping client says before it closes with 1000 "bye".
BYE = m.Bye(reason="client stopping")


def tls_context(url: str, ca: str | os.PathLike[str] | None) -> ssl.SSLContext | None:
    """For a ``wss://`` URL with ``ca``: a context trusting those certificates (a
    self-signed coordinator's) instead of the system's store; None without."""
    if ca is None:
        return None
    if not url.startswith("wss://"):
        raise ValueError(f"ca: {url} is not a wss:// URL")
    try:
        return ssl.create_default_context(cafile=os.fspath(ca))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"ca {ca}: {exc}") from None


class Backoff:
    """When to connect again: exponential backoff with full jitter (AWS
    architecture blog, "Exponential Backoff And Jitter"). Attempt ``n`` waits
    ``uniform(0, min(cap, base * 2**n))``; a connection that joined starts the
    count again; after ``max_attempts`` failed ones in a row, none."""

    def __init__(
        self, *, base: float, cap: float, seed: int, max_attempts: int | None = None
    ) -> None:
        if not base > 0 or cap < base:
            raise ValueError(f"backoff: need 0 < base <= cap, got base {base!r}, cap {cap!r}")
        self.base, self.cap, self.max_attempts = base, cap, max_attempts
        #: the attempt the next connection is (1: the first since a join)
        self.attempt = 0
        self._jitter = random.Random(seed)

    def next(self, *, joined: bool) -> float | None:
        """A connection ended or failed (``joined``: it was welcomed): seconds to
        wait before the next, or None to give up."""
        self.attempt = 1 if joined else self.attempt + 1
        if self.max_attempts is not None and self.attempt > self.max_attempts:
            return None
        return self._jitter.uniform(0, min(self.cap, self.base * 2**self.attempt))


class ClientBase:
    """A session, a URL and the hooks a driver fills in: ``_send_frame``,
    ``_start_compute``, ``_job_finished``, ``_close_link`` (and ``_acted``,
    after each batch of actions)."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None,
        seed: int,
        backoff_base: float,
        backoff_cap: float,
        max_attempts: int | None = None,
        ca: str | os.PathLike[str] | None = None,
        clock: Callable[[], float],
    ) -> None:
        self.url = url
        self.token = token
        self.backoff = Backoff(
            base=backoff_base, cap=backoff_cap, seed=seed, max_attempts=max_attempts
        )
        #: wss:// trusts these certificates instead of the system's store (None: it)
        #: the volunteer key hello carries (client/identity.py); None: anonymous
        self.volunteer: str | None = None
        self.tls = tls_context(url, ca)
        self._clock = clock
        self.session: ClientSession | None = None

    def _capabilities(
        self,
        *,
        flops: float,
        cores: int,
        platform: str,
        seeded_init: bool = True,
        prefetch: bool,
        data: bool,
        limits: LinkLimits | None = None,
    ) -> Capabilities:
        """What hello says: every codec this build decodes (as many as hello
        carries), the seeded-init scheme when it builds version 0 itself, the token."""
        return Capabilities(
            flops=flops,
            cores=cores,
            platform=platform[:64],
            codecs=tuple(n for n in codecs.names() if len(n) <= 32)[:32],
            seeded_init=seeded_init,
            init_schemes=(INIT_SCHEME,) if seeded_init else (),
            prefetch=prefetch,
            data=data,
            limits=limits,
            token=self.token,
            volunteer=self.volunteer,
            kernel=KERNEL,
        )

    @property
    def connected(self) -> bool:
        """The session is on a connection (hello sent, or welcomed)."""
        return self.session is not None and self.session.phase in (Phase.HELLO_SENT, Phase.READY)

    @property
    def busy(self) -> bool:
        """A task computes, or a result awaits its ack."""
        s = self.session
        return s is not None and (s.computing is not None or s.pending is not None)

    def _frame_in(self, frame: bytes | str, now: float) -> tuple[m.Message | None, list[Action]]:
        """A frame from the coordinator, to the session: ``(message, actions)``. One
        that does not decode is refused: ``(None, [error, close 4000 + code])``."""
        session = self.session
        assert session is not None
        try:
            if isinstance(frame, str):
                raise ProtocolError(ErrorCode.MALFORMED, "a text frame (binary only)")
            msg = m.decode(frame)
        except ProtocolError as exc:
            log.warning("bad frame from the coordinator: %s", exc)
            return None, session.refuse(exc, now)
        return msg, session.receive(msg, now)

    def _do(self, actions: list[Action]) -> None:
        for a in actions:
            match a:
                case Send():
                    self._send_frame(a.frame)
                case ComputeRequest():
                    self._start_compute(a)
                case Finished():
                    log.info("job finished: %s", a.reason)
                    self._job_finished(a.reason)
                case Close():
                    self._close_link(a.code, a.reason)
                case _:
                    assert_never(a)
        self._acted()

    def _computed(self, req: ComputeRequest, out: ComputeOutput, seconds: float) -> None:
        """``req``'s compute finished (``seconds``: what it took): its result out."""
        assert self.session is not None
        self._do(
            self.session.compute_done(
                req.request_id,
                out.update,
                self._clock(),
                loss=out.loss,
                samples=out.samples,
                steps=out.steps,
                compute_seconds=seconds,
                metrics=out.metrics,
                boundary=out.boundary,
            )
        )

    def _compute_raised(self, req: ComputeRequest, exc: BaseException) -> None:
        """``req``'s compute raised: the task is declined (another client gets it)."""
        assert self.session is not None
        log.error("task %s failed: %s", req.task.task_id, exc)
        word = "memory" if isinstance(exc, MemoryError) else "compute"
        reason = f"{word}: {type(exc).__name__}: {exc}"
        self._do(self.session.compute_failed(req.request_id, reason, self._clock()))

    def _lost(self) -> None:
        """The connection is gone: the session keeps its model, compute and results."""
        if self.connected:
            assert self.session is not None
            self.session.connection_lost(self._clock())

    def _leave(self) -> bytes:
        """A stop's last act before close 1000 "bye": a task still in hand (its
        compute or its ack) is abandoned; the ``bye`` frame to send."""
        if self.busy:
            log.info("stopping: task abandoned")
        if self.session is not None:
            self.session.computing = None  # a slice in progress sees this and stops
        return m.encode(BYE)

    # -- the driver's hooks ------------------------------------------------------------

    def _send_frame(self, frame: bytes) -> None:
        raise NotImplementedError

    def _start_compute(self, req: ComputeRequest) -> None:
        raise NotImplementedError

    def _job_finished(self, reason: str) -> None:
        raise NotImplementedError

    def _close_link(self, code: int, reason: str) -> None:
        raise NotImplementedError

    def _acted(self) -> None:
        """After each batch of actions (the desktop client wakes its ticker)."""
