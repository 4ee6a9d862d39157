"""Recent model versions, so a download can be a delta instead of the full model.

A client that already holds version ``v`` needs only ``current − v``; encoded with
a lossy codec that is far fewer bytes than the model. The coordinator keeps the
last ``max_versions`` flat buffers here (memory: ``max_versions × model bytes``)
and falls back to the full model when ``v`` has been evicted.

Caveat for lossy download codecs: the client's copy then drifts from ``v`` by the
codec error, so a coordinator should send a full model every so often.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np


class VersionHistory:
    """Flat float32 snapshots of the last ``max_versions`` versions, oldest first."""

    __slots__ = ("_versions", "max_versions")

    def __init__(self, max_versions: int) -> None:
        if max_versions < 1:
            raise ValueError(f"version history: max_versions must be >= 1, got {max_versions}")
        self.max_versions = max_versions
        self._versions: OrderedDict[int, np.ndarray] = OrderedDict()

    def push(self, version: int, flat: np.ndarray) -> None:
        """Record ``version`` (a copy of ``flat``); versions must increase."""
        if self._versions and version <= self.latest:
            raise ValueError(f"version history: version {version} is not after {self.latest}")
        if self._versions and flat.shape != self._versions[self.latest].shape:
            raise ValueError(
                f"version history: {flat.size} values, earlier versions had "
                f"{self._versions[self.latest].size}"
            )
        if flat.dtype != np.float32 or flat.ndim != 1:
            raise ValueError("version history: need a 1-D float32 buffer (Params.data)")
        self._versions[version] = flat.copy()
        while len(self._versions) > self.max_versions:
            self._versions.popitem(last=False)

    @property
    def latest(self) -> int:
        if not self._versions:
            raise LookupError("version history is empty")
        return next(reversed(self._versions))

    def __contains__(self, version: int) -> bool:
        return version in self._versions

    def get(self, version: int) -> np.ndarray | None:
        """The snapshot of ``version`` (read-only view), or None if it was evicted."""
        snap = self._versions.get(version)
        if snap is None:
            return None
        view = snap.view()
        view.flags.writeable = False
        return view

    def delta(self, from_version: int) -> np.ndarray | None:
        """``latest − from_version`` as a new array, or None: too old, send the full model."""
        base = self._versions.get(from_version)
        if base is None:
            return None
        return self._versions[self.latest] - base

    def versions(self) -> list[int]:
        return list(self._versions)

    def __len__(self) -> int:
        return len(self._versions)
