"""Model distribution: how a task's model reaches its client (seeded init, the
full model chunked once per version and link, or a delta), in one place.

Deltas: send ``current − held`` instead of the whole model.

A client that already holds version ``h`` (the core knows: it sent it, on the
same connection, and the lease did not expire) needs only ``current − h``,
encoded with its connection's delta codec (the job's ``codecs.delta``, or the
slow-link codec, which slow clients get without one); full models, likewise, go in
the connection's model codec. The core keeps snapshots of the versions it served
(a :class:`compression.VersionHistory` of linkcodecs.delta_versions entries), so
memory is bounded by the config and not by the number of clients; a held version
that has been evicted gets the full model.

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

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from compression import VersionHistory
from coordinator.core.config import CodecSection
from coordinator.core.leases import Task
from coordinator.core.linkcodecs import LinkCodecs
from nn.params import Params
from nn.spec import ModelSpec
from protocol import messages as m
from protocol.chunking import chunk_params
from protocol.limits import LinkLimits


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

    def __init__(
        self, config: CodecSection, spec: ModelSpec, rng: np.random.Generator, versions: int
    ) -> None:
        self.max_chain = config.max_delta_chain
        self.history = VersionHistory(versions)
        self.rng = rng
        self._spec = spec
        self._cache: dict[tuple[int, int, int | None, bool, str], Delta] = {}

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
        codec: str,
        max_message_bytes: int,
        target_bytes: int | None = None,
        spans: bool = False,
    ) -> Delta | None:
        """``version − held`` in ``codec`` as chunks, or None when ``held`` is no
        longer kept.

        Call after ``served(version, ...)``. Cached per ``(held, version)``, frame
        size, spans and codec: every client holding ``held`` on the same kind of
        link gets the same frames.
        """
        if held >= version or held not in self.history or self.history.latest != version:
            return None
        key = (held, version, target_bytes, spans, codec)
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
            codec=codec,
            transfer=transfer,
            rng=self.rng,
            target_bytes=target_bytes,
            spans=spans,
        )
        d = Delta(held, version, transfer, chunks, [m.encode(c) for c in chunks])
        self._cache[key] = d
        return d


@dataclass(frozen=True, slots=True)
class Download:
    """How a task's model reaches its client, decided once (``ModelDistribution.plan``).

    ``kind``: ``seed`` (the client builds version 0 from the init seed), ``none``
    (it holds ``version``), ``full`` or ``delta`` (``chunks``/``frames`` follow;
    a delta adds to ``delta_base``, the version the client holds).
    """

    kind: str
    version: int
    transfer: str = ""
    chunks: tuple[m.Chunk, ...] = ()
    frames: tuple[bytes, ...] = ()
    delta_base: int | None = None

    @property
    def nbytes(self) -> int:
        return sum(len(f) for f in self.frames)


class ModelDistribution:
    """Everything about getting the model to clients, in one place: seeded init,
    the full model (chunked once per version and link shape), deltas from what a
    client holds, the delta chain bound, and twins' older snapshots.

    ``model()`` returns ``(version, params)`` now; ``snapshot(v)`` an older
    version's flat parameters (replication's twins). Per-connection state (the
    delta chain, the link's codecs) lives on the connection and is passed in.
    """

    def __init__(
        self,
        *,
        spec: ModelSpec,
        codecs: CodecSection,
        max_message_bytes: int,
        model: Callable[[], tuple[int, Params]],
        snapshot: Callable[[int], np.ndarray],
        rng: np.random.Generator,
        delta_rng: np.random.Generator,
        delta_versions: int,
    ) -> None:
        self.spec = spec
        self.max_message_bytes = max_message_bytes
        self.model = model
        self.snapshot = snapshot
        self.rng = rng
        self.deltas = (
            DeltaServer(codecs, spec, delta_rng, delta_versions) if delta_versions else None
        )
        # (frame target, spans, codec) -> (version, transfer, chunks, frames) of the
        # current model
        self._cache: dict[tuple[int, bool, str], tuple[int, str, list[m.Chunk], list[bytes]]] = {}

    def plan(
        self,
        *,
        task_version: int,
        held: int | None,
        seeded: bool,
        wants_deltas: bool,
        chain: int,
        limits: LinkLimits,
        spans: bool,
        codecs: LinkCodecs,
    ) -> tuple[Download, int]:
        """The download for a task of ``task_version`` to a client holding ``held``,
        and the client's delta chain after it. ``seeded``: it builds version 0 itself;
        ``codecs``: its link's (the model's and the delta's)."""
        v, params = self.model()
        if seeded:
            if self.deltas is not None:  # its later downloads can be deltas from 0
                self.deltas.served(0, params)
            return Download("seed", 0), chain
        if task_version != v:  # a twin's older version: its snapshot, in full
            version, transfer, chunks, frames = self.chunks(
                limits, spans, codecs.model, task_version
            )
            return self._full(held, version, transfer, chunks, frames), 0
        if self.deltas is not None and held != v:
            self.deltas.served(v, params)
            delta = codecs.delta
            if wants_deltas and delta and held is not None and chain < self.deltas.max_chain:
                d = self.deltas.delta(
                    held, v, codec=delta, max_message_bytes=limits.max_message_bytes,
                    target_bytes=limits.frame_bytes, spans=spans,
                )  # fmt: skip
                if d is not None:
                    return Download(
                        "delta", v, d.transfer, tuple(d.chunks), tuple(d.frames), held
                    ), chain + 1
        version, transfer, chunks, frames = self.chunks(limits, spans, codecs.model)
        return self._full(held, version, transfer, chunks, frames), (chain if held == v else 0)

    def subnet(self, task: Task, limits: LinkLimits, spans: bool, codec: str) -> Download:
        """A sub-model task's slice of the current model, in full (in ``codec``).

        Each task's subnet is its own, so slices are built per task and not cached;
        the transfer is named by the task, so a client never mistakes one slice for
        another or for a version it holds (the core records none held after it)."""
        v, params = self.model()
        assert task.subnet is not None and task.version == v
        return self.part(task, task.subnet.slice(params), limits, spans, codec)

    def part(
        self, task: Task, part: Params, limits: LinkLimits, spans: bool, codec: str
    ) -> Download:
        """What a task trains when it is not the whole model (a subnet's slice, a
        layer-split block), taken now from the current version: in full, per task."""
        v, _ = self.model()
        assert task.version == v
        transfer = f"sub-{task.task_id}-{v}"
        chunks, frames = self._chunked(part, transfer, limits, spans, codec)
        return Download("full", v, transfer, tuple(chunks), tuple(frames))

    def _chunked(
        self, params: Params, transfer: str, limits: LinkLimits, spans: bool, codec: str
    ) -> tuple[list[m.Chunk], list[bytes]]:
        """``params`` in ``codec`` as chunks sized to the link, and their frames."""
        chunks = chunk_params(
            params,
            max_message_bytes=min(limits.max_message_bytes, self.max_message_bytes),
            codec=codec,
            transfer=transfer,
            rng=self.rng,
            target_bytes=limits.frame_bytes,
            spans=spans,
        )
        return chunks, [m.encode(c) for c in chunks]

    @staticmethod
    def _full(
        held: int | None, version: int, transfer: str, chunks: list[m.Chunk], frames: list[bytes]
    ) -> Download:
        if held == version:
            return Download("none", version)
        return Download("full", version, transfer, tuple(chunks), tuple(frames))

    def chunks(
        self, limits: LinkLimits, spans: bool, codec: str, version: int | None = None
    ) -> tuple[int, str, list[m.Chunk], list[bytes]]:
        """The current model (or an older ``version``) in ``codec`` as chunks and frames.

        Frames are sized to the client's link (``LinkLimits.frame_bytes``) and span
        blocks if it takes that; each (link, spans, codec) gets its own copy, built
        once per version, and a new version drops the old ones. An older version (a
        twin's snapshot, rare) is built each time and not cached.
        """
        v, params = self.model()
        key = (limits.frame_bytes, spans, codec)
        cached = self._cache.get(key)
        if cached is not None and cached[0] == v and version in (None, v):
            return cached
        if version not in (None, v):
            v = version
            params = Params.from_flat(self.spec, self.snapshot(v), copy=False)
        transfer = f"model-{v}"
        chunks, frames = self._chunked(params, transfer, limits, spans, codec)
        entry = (v, transfer, chunks, frames)
        if v == self.model()[0]:
            cache = {k: e for k, e in self._cache.items() if e[0] == v}  # drop old ones
            cache[key] = entry
            self._cache = cache
        return entry
