"""The listening socket and the URL clients join: standard library only.

Why a module of its own: ``crowdgrad coordinator`` binds before it imports the
web stack and the numba kernels (most of a second of CPU), so a client that
starts beside it connects and waits in the accept queue instead of being
refused and backing off; importing ``coordinator.http.server`` for these two would
import all of that first.
"""

from __future__ import annotations

import socket

#: Connections the kernel queues before uvicorn accepts them (a client that
#: connects while the coordinator still starts waits here).
BACKLOG = 2048


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: an ephemeral one; read it with getsockname)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


def join_url(host: str, port: int, *, tls: bool = False) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    if ":" in shown:
        shown = f"[{shown}]"
    return f"{'wss' if tls else 'ws'}://{shown}:{port}/ws"
