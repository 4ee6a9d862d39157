"""Persistent chunked checkpoint store (SQLite by default) and the durable delta log."""

from storage.chunkstore import ChunkStore, Deferred, Inherited, ManifestRecord
from storage.deltalog import DeltaEntry, DeltaLog
from storage.errors import (
    CheckpointExists,
    CorruptCheckpoint,
    CorruptDeltaLog,
    NoCheckpoint,
    StorageError,
    WriteBudgetExceeded,
)
from storage.groupcommit import GroupCommit
from storage.layout import Checkpoint, LiveParams, ParamsPatch
from storage.limits import StoreLimits, WriteBudget
from storage.retention import RetentionPolicy
from storage.sqlite import SqliteChunkStore
from storage.store import CheckpointInfo, CheckpointStore, VerifyReport

__all__ = [
    "Checkpoint",
    "CheckpointExists",
    "CheckpointInfo",
    "CheckpointStore",
    "ChunkStore",
    "CorruptCheckpoint",
    "CorruptDeltaLog",
    "Deferred",
    "DeltaEntry",
    "DeltaLog",
    "GroupCommit",
    "Inherited",
    "LiveParams",
    "ManifestRecord",
    "NoCheckpoint",
    "ParamsPatch",
    "RetentionPolicy",
    "SqliteChunkStore",
    "StorageError",
    "StoreLimits",
    "VerifyReport",
    "WriteBudget",
    "WriteBudgetExceeded",
]
