"""The volunteer's key: made once, kept in the client's cache folder, sent in hello.

The key is what the coordinator keeps credit under (its public id, never the key,
is what anyone else sees), so a volunteer keeps its credit across sessions and
restarts. It is a secret: the file is readable by its owner only, and a client
that must not be linked to its past runs sends none (``--anonymous``).
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from protocol.volunteer import check_key

log = logging.getLogger(__name__)

#: the key's file in the cache folder
KEY_FILE = "volunteer.key"


def new_key() -> str:
    """A fresh key: 43 URL-safe characters (256 random bits)."""
    return secrets.token_urlsafe(32)


def volunteer_key(folder: Path) -> str:
    """The key kept in ``folder`` (made there on first use). A missing, unreadable or
    malformed file gets a new key, written owner-only; where the folder cannot be
    written, the key lives for this run only (and a warning says so)."""
    path = folder / KEY_FILE
    try:
        key = path.read_text().strip()
        if check_key(key) is None:
            return key
        log.warning("%s is no volunteer key; making a new one", path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("cannot read %s (%s); making a new volunteer key", path, exc)
    key = new_key()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("cannot keep the volunteer key in %s (%s): credit for this run only", path, exc)
    return key
