"""A volunteer's identity on the wire: its secret key, public id and display name.

``hello.volunteer`` carries a key the client keeps across sessions (16..128
letters, digits, ``-`` or ``_``); the server keeps credit under its public id
(``volunteer_id``: 16 hex digits of a sha256, which tell nothing of the key) and
says it in ``welcome.volunteer``. With a key, ``hello.client`` is the name shown
beside the credit, so it must pass ``check_name`` (docs/protocol.md §3.1).
"""

from __future__ import annotations

import hashlib
import unicodedata

#: a volunteer key's accepted length, and the characters it may use
KEY_MIN, KEY_MAX = 16, 128
KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
#: a display name's most characters
NAME_MAX = 32


def volunteer_id(key: str) -> str:
    """The public id of a volunteer key: 16 hex digits, which tell nothing of the key."""
    return hashlib.sha256(b"crowdgrad-volunteer:" + key.encode()).hexdigest()[:16]


def check_key(key: str) -> str | None:
    """Why ``key`` is no volunteer key, or None."""
    if not KEY_MIN <= len(key) <= KEY_MAX:
        return f"{KEY_MIN}..{KEY_MAX} characters, got {len(key)}"
    if not set(key) <= KEY_CHARS:
        return "letters, digits, '-' and '_' only"
    return None


def check_name(name: str) -> str | None:
    """Why ``name`` may not be shown on a leaderboard, or None: printable text of
    at most NAME_MAX characters, no control, format (bidi overrides, zero-width)
    or separator characters other than a plain space, not blank."""
    if not name.strip():
        return "a non-blank name"
    if len(name) > NAME_MAX:
        return f"at most {NAME_MAX} characters, got {len(name)}"
    for c in name:
        if c != " " and unicodedata.category(c)[0] in "CZ":
            return f"printable characters only (not U+{ord(c):04X})"
    return None
