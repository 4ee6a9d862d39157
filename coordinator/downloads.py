"""Model deltas for downloads: send ``current − held`` instead of the whole model.

A client that already holds version ``h`` (the core knows: it sent it, on the
same connection, and the lease did not expire) needs only ``current − h``,
encoded with the job's ``codecs.delta``. The core keeps snapshots of the
versions it served in a :class:`compression.VersionHistory` of
``codecs.delta_versions`` entries, so memory is bounded by the config and not by
the number of clients; a held version that has been evicted gets the full model.

Drift. A lossy delta codec leaves the client with ``h + decode(encode(Δ))``,
not the server's version; the next delta is again computed from the server's
snapshot of ``h'``, so the errors of consecutive deltas add up. ``fp32`` deltas
are exact; ``fp16`` ones add at most 2⁻¹¹ relative error of each delta. The core
therefore sends a full model after ``codecs.max_delta_chain`` deltas in a row,
which bounds the drift to that many codec errors. (The alternative, tracking
each client's exact decoded copy on the server, costs one model per client and
gives up encoding a delta once for every client that holds the same version.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compression import VersionHistory
from coordinator.config import CodecSection
from nn.params import Params
from nn.spec import ModelSpec
from protocol import messages as m
from protocol.chunking import chunk_params


@dataclass(frozen=True, slots=True)
class Delta:
    """The chunks (and their frames) of ``version − base``."""

    base: int
    version: int
    transfer: str
    chunks: list[m.Chunk]
    frames: list[bytes]


class DeltaServer:
    """Snapshots of served versions and an encode-once cache of deltas."""

    def __init__(self, config: CodecSection, spec: ModelSpec, rng: np.random.Generator) -> None:
        if config.delta is None:
            raise ValueError("delta server: codecs.delta is not set")
        self.codec = config.delta
        self.max_chain = config.max_delta_chain
        self.history = VersionHistory(config.delta_versions)
        self.rng = rng
        self._spec = spec
        self._cache: dict[tuple[int, int, int | None, bool], Delta] = {}

    def served(self, version: int, params: Params) -> None:
        """``version`` is being sent to a client: keep a snapshot (once per version)."""
        if not len(self.history) or self.history.latest < version:
            self.history.push(version, params.data)
            self._cache.clear()  # deltas to older versions are never sent again

    def delta(
        self,
        held: int,
        version: int,
        *,
        max_message_bytes: int,
        target_bytes: int | None = None,
        spans: bool = False,
    ) -> Delta | None:
        """``version − held`` as chunks, or None when ``held`` is no longer kept.

        Call after ``served(version, ...)``. Cached per ``(held, version)`` and
        frame size and spans: every client holding ``held`` on the same link gets the
        same frames.
        """
        if held >= version or held not in self.history or self.history.latest != version:
            return None
        key = (held, version, target_bytes, spans)
        cached = self._cache.get(key)
        if cached is not None and max(map(len, cached.frames)) <= max_message_bytes:
            return cached
        snap = self.history.get(version)
        base = self.history.get(held)
        assert snap is not None and base is not None
        diff = Params.from_flat(self._spec, snap - base, copy=False)
        transfer = f"delta-{held}-{version}"
        chunks = chunk_params(
            diff,
            max_message_bytes=max_message_bytes,
            codec=self.codec,
            transfer=transfer,
            rng=self.rng,
            target_bytes=target_bytes,
            spans=spans,
        )
        d = Delta(held, version, transfer, chunks, [m.encode(c) for c in chunks])
        self._cache[key] = d
        return d
