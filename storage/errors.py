"""Errors raised by the storage package, split by what the operator can do about it.

::

    StorageError                  anything the store refuses or cannot do
    ├── NoCheckpoint              nothing (valid) to load: empty store, unknown version
    ├── CorruptCheckpoint         a checksum, chunk or manifest does not match
    ├── CheckpointExists          a version at or below the newest stored one
    ├── CorruptDeltaLog           an accepted delta no longer reads back intact
    └── WriteBudgetExceeded       the configured writes-per-minute budget is spent

``NoCheckpoint`` is also a ``LookupError`` and the rest ``ValueError`` where that is
what they are, so callers that only know the builtin categories still catch them.
"""

from __future__ import annotations


class StorageError(Exception):
    """Base of every error the storage package raises on purpose."""


class NoCheckpoint(StorageError, LookupError):
    """No checkpoint to load: the store is empty, or the asked version is absent."""


class CorruptCheckpoint(StorageError, ValueError):
    """A stored checkpoint failed verification; ``version`` names which one."""

    def __init__(self, version: int, reason: str) -> None:
        super().__init__(f"checkpoint v{version} is corrupt: {reason}")
        self.version = version
        self.reason = reason


class CheckpointExists(StorageError, ValueError):
    """Versions only grow: saving at or below the newest stored version is refused."""


class CorruptDeltaLog(StorageError, ValueError):
    """An entry of the delta log does not match its checksum."""


class WriteBudgetExceeded(StorageError):
    """The store's writes-per-minute budget cannot take this write now.

    ``retry_after`` is how many seconds (of the caller's clock) until it can.
    """

    def __init__(self, needed: int, retry_after: float) -> None:
        super().__init__(
            f"write budget exceeded: {needed} write(s) needed, retry in {retry_after:.2f} s"
        )
        self.needed = needed
        self.retry_after = retry_after
