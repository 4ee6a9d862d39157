"""Socket transports after their connection ends: nothing of it kept alive.

Imported before the server is (admission is, for the CLI's early listen), so it
imports nothing heavy.
"""

from __future__ import annotations

from typing import Any


def drop_transport_cycle(transport: Any) -> None:
    """Unhook a closed socket transport from itself. CPython 3.11's selector transport
    keeps its read callback as a bound method of itself (``_read_ready_cb``), a
    reference cycle: every closed connection's transport and socket then waited for
    a full collection, which ``crowdgrad.process.tune_gc`` runs rarely. Called from
    ``connection_lost``, when the transport reads no more; harmless where the
    attribute is absent."""
    if getattr(transport, "_read_ready_cb", None) is not None:
        transport._read_ready_cb = None
