"""A stop that always ends: SIGINT and SIGTERM from a command's start to its end.

The first signal asks for a graceful stop and arms a watchdog that ends the
process ``grace_s`` later, whatever the stop is waiting on
(``crowdgrad coordinator``; docs/operations.md, "Stopping").
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from typing import Any

#: Exit status when a stop did not finish within ``--stop-grace``.
EXIT_STOP_TIMEOUT = 1


class StopGuard:
    """SIGINT and SIGTERM from the command's start to its end: the first asks for a
    graceful stop and arms a watchdog that ends the process ``grace_s`` later,
    whatever the stop is waiting on.

    Why: uvicorn installs its handlers only once it serves; a no-op handler in
    front of it swallowed a signal that came in between, and the coordinator
    served on (issue 34). Here a signal before serving skips serving, one
    while the server starts tells the server (``attach``) and one while it
    serves reaches it through uvicorn's handler (``stopping`` arms the watchdog
    there too). The watchdog is the last resort: a final checkpoint cut short
    is a crash to the store (the previous checkpoint stays, and no result was
    acknowledged that only the cut one held).
    """

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        #: the first signal caught, None while none came
        self.requested: int | None = None
        self._server: Any = None
        self._timer: threading.Timer | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous.setdefault(sig, signal.signal(sig, self._caught))

    def restore(self) -> None:
        """Put the handlers found back; an armed watchdog stays armed (it is a
        daemon thread, so it never holds up an exit that comes in time)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def attach(self, server: Any) -> None:
        """From now on a signal tells ``server`` to exit (and one before did already)."""
        self._server = server
        server.stopping = self.arm
        if self.requested is not None:
            server.should_exit = True

    def _caught(self, signum: int, frame: object) -> None:
        if self.requested is None:
            self.requested = signum
        if self._server is not None:
            self._server.should_exit = True
        self.arm()

    def arm(self) -> None:
        """Start the watchdog (once): the process ends ``grace_s`` from now at the latest."""
        if self._timer is None and self.grace_s > 0:
            self._timer = threading.Timer(self.grace_s, self._expired)
            self._timer.daemon = True
            self._timer.start()

    def _expired(self) -> None:
        logging.getLogger("crowdgrad.coordinator").error(
            "stop did not finish within --stop-grace %g s; exiting now (the store keeps "
            "its last committed checkpoint)",
            self.grace_s,
        )
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        os._exit(EXIT_STOP_TIMEOUT)
