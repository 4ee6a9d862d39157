"""Checkpoint layout: how a checkpoint becomes a JSON manifest plus binary chunks.

Chunks, in this order, each at most ``max_chunk_bytes`` and each with a sha256:

1. Params, one chunk per neuron group from ``nn.params.plan_groups(spec,
   max_chunk_bytes // 4)`` in layer order. A chunk's bytes are the group's W rows
   (row-major float32, little-endian) followed by its biases, so a group is one
   key, the way the seed stored it, and a reader restores it with two copies.
2. State arrays (optimizer, then strategy; names sorted), each split into
   byte ranges of at most ``max_chunk_bytes``.

An incremental checkpoint (``Checkpoint.params`` a ``ParamsPatch``) writes only
the params chunks of the neuron groups that changed since its ``base``; the
manifest entry of every other group keeps base's sha256 and names the version
whose chunk holds the bytes (``"in"``), so a reader verifies it like any chunk.
States are always written whole (they are small next to the model).

Scalars of the state dicts, the spec, job metadata and the applied result ids
go in the manifest JSON. The manifest's own sha256 sits beside it, so a damaged
manifest is caught before anything it points at is trusted.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from concurrent.futures import Executor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nn.params import NeuronGroup, Params, plan_groups
from nn.spec import ModelSpec
from storage.chunkstore import Inherited
from storage.errors import CorruptCheckpoint

FORMAT = "crowdgrad-checkpoint"
FORMAT_VERSION = 2
#: manifest format versions this code reads (2 added ``base`` and ``"in"``)
READABLE_FORMATS = (1, 2)
STATE_KINDS = ("optimizer", "strategy")

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("storage.layout writes little-endian float32 and assumes a little host")

State = Mapping[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamsPatch:
    """The params of an incremental checkpoint: the neuron groups that changed
    since checkpoint ``base``, copied; every other group is base's.

    ``groups`` maps a chunk index of ``plan_groups(spec, max_chunk_bytes // 4)``
    (the store's own plan, ``CheckpointStore.param_groups``) to that group's W rows
    and biases: one float32 array, or a tuple of arrays whose concatenation it is
    (views into a model nobody changes until the save returns). Only what changed
    is copied, which is what lets a model too big to hold twice be checkpointed
    while it trains.
    """

    spec: ModelSpec
    base: int
    groups: Mapping[int, np.ndarray | tuple[np.ndarray, ...]]

    def __post_init__(self) -> None:
        for i, a in self.groups.items():
            for part in a if isinstance(a, tuple) else (a,):
                if not isinstance(part, np.ndarray) or part.dtype != np.float32 or part.ndim != 1:
                    raise ValueError(f"params patch: group {i} must be 1-D float32 arrays")

    @classmethod
    def of(
        cls,
        params: Params,
        plan: list[NeuronGroup],
        changed: Iterable[int],
        base: int,
        *,
        copy: bool = True,
    ) -> ParamsPatch:
        """A patch holding ``params``' groups ``changed`` (indices into ``plan``, the
        store's ``param_groups``), the rest to come from ``base``: copies, or with
        ``copy=False`` views (saved before the model moves again)."""
        groups: dict[int, np.ndarray | tuple[np.ndarray, ...]] = {}
        for i in sorted(set(changed)):
            ws, bs = params.group_slices(plan[i])
            parts = (params.data[ws], params.data[bs])
            groups[i] = np.concatenate(parts) if copy else parts
        return cls(spec=params.spec, base=base, groups=groups)


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveParams:
    """A model that keeps training while it is saved: a *fuzzy* checkpoint.

    Each group is copied when the store writes it (``read``), under ``lock`` (held
    by every write to the model together with its version step), and its manifest
    entry records ``as_of``, the model version it was copied at. Such a
    checkpoint is not the model of one version: it is usable with a log of what
    changed after ``Checkpoint.version``, replayed on each group from its own
    ``as_of`` on (coordinator/runtime/journal.py). With ``base``, only ``groups`` are
    read and the rest is inherited, as for a ``ParamsPatch``. ``guard`` is called
    under the lock before each copy and raises to abandon the save (a write the
    log cannot redo happened meanwhile).
    """

    params: Params
    lock: AbstractContextManager[Any]
    version: Callable[[], int]
    base: int | None = None
    groups: frozenset[int] | None = None
    guard: Callable[[], None] | None = None

    @property
    def spec(self) -> ModelSpec:
        return self.params.spec

    def read(self, g: NeuronGroup) -> tuple[tuple[np.ndarray, ...], int]:
        with self.lock:
            if self.guard is not None:
                self.guard()
            ws, bs = self.params.group_slices(g)
            copy = np.concatenate((self.params.data[ws], self.params.data[bs]))
            return (copy.view(np.uint8),), int(self.version())


@dataclass(frozen=True, slots=True)
class LiveChunk:
    """A chunk of ``LiveParams``: ``read()`` gives its buffers and its ``as_of``."""

    read: Callable[[], tuple[tuple[np.ndarray, ...], int]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """Everything the coordinator needs to carry on: model, states, job, applied ids.

    ``optimizer`` and ``strategy`` are generic ``name -> ndarray | JSON scalar``
    dicts (``OptState.state_dict()`` is one); ``applied_results`` are the result
    ids folded into ``params``, which keeps "apply at most once" true across restarts.
    """

    version: int
    created_at: float
    params: Params | ParamsPatch | LiveParams
    optimizer: State = field(default_factory=dict)
    strategy: State = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    applied_results: tuple[str, ...] = ()
    #: as loaded: per params chunk, the version its bytes are of (``version`` for
    #: each, except in a fuzzy checkpoint, see ``LiveParams``)
    as_of: tuple[int, ...] = ()

    @property
    def spec(self) -> ModelSpec:
        return self.params.spec


def sha256_hex(*parts: Any) -> str:
    """sha256 of the concatenation of ``parts`` (buffers), without concatenating them."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
    return h.hexdigest()


def _split_state(kind: str, state: State) -> tuple[dict, dict, list[tuple[str, np.ndarray]]]:
    scalars: dict[str, Any] = {}
    arrays: dict[str, dict] = {}
    data: list[tuple[str, np.ndarray]] = []
    for name in sorted(state):
        value = state[name]
        if not isinstance(name, str):
            raise ValueError(f"{kind} state: key {name!r} is not a string")
        if isinstance(value, np.ndarray):
            if value.dtype.hasobject:
                raise ValueError(f"{kind} state {name!r}: object arrays cannot be stored")
            arr = np.ascontiguousarray(value)
            arrays[name] = {"dtype": arr.dtype.str, "shape": list(arr.shape)}
            data.append((name, arr.reshape(-1).view(np.uint8)))
        else:
            if isinstance(value, np.generic):
                value = value.item()
            try:
                json.dumps(value, allow_nan=True)
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"{kind} state {name!r}: not an array or JSON value ({exc})"
                ) from None
            scalars[name] = value
    return scalars, arrays, data


Chunk = tuple[np.ndarray, ...]


def group_values(spec: ModelSpec, g: NeuronGroup) -> int:
    """How many float32 values group ``g``'s chunk holds (W rows and biases)."""
    return g.rows * (spec.layer_shapes[g.layer][1] + 1)


def encode(
    ckpt: Checkpoint, max_chunk_bytes: int, base: dict | None = None
) -> tuple[dict, list[Chunk | Inherited | LiveChunk]]:
    """``(manifest without hashes, chunks)``; hashes are filled in by ``seal``.

    A chunk is a tuple of zero-copy uint8 views whose concatenation is its bytes
    (a params chunk is ``(W rows, biases)``), so encoding copies nothing, or a
    ``LiveChunk`` read when it is written. For a ``ParamsPatch`` (or a
    ``LiveParams`` with a base), ``base`` is the base checkpoint's manifest; each
    unchanged group becomes an ``Inherited`` chunk whose entry already carries its
    sha256 (and its ``as_of``, if it has one).
    """
    if ckpt.version < 0:
        raise ValueError(f"checkpoint version must be >= 0, got {ckpt.version}")
    params = ckpt.params
    chunks: list[Chunk | Inherited | LiveChunk] = []
    entries: list[dict] = []
    groups = plan_groups(params.spec, max_chunk_bytes // 4)
    present: Collection[int] | None = None  # None: every group is written
    if isinstance(params, ParamsPatch):
        present = params.groups.keys()
    elif isinstance(params, LiveParams) and params.base is not None:
        present = params.groups if params.groups is not None else range(len(groups))
    if present is not None:
        inherit = _inheritance(ckpt.version, params, present, base, groups, max_chunk_bytes)
    for i, g in enumerate(groups):
        entry: dict[str, Any] = {
            "kind": "params",
            "layer": g.layer,
            "rows": [g.row_start, g.row_end],
        }
        if isinstance(params, Params):
            ws, bs = params.group_slices(g)
            chunks.append((params.data[ws].view(np.uint8), params.data[bs].view(np.uint8)))
        elif isinstance(params, LiveParams) and (present is None or i in present):
            chunks.append(LiveChunk(functools.partial(params.read, g)))
        elif isinstance(params, ParamsPatch) and i in params.groups:
            vals = params.groups[i]
            parts = vals if isinstance(vals, tuple) else (vals,)
            have, need = sum(p.size for p in parts), group_values(params.spec, g)
            if have != need:
                raise ValueError(
                    f"params patch: group {i} holds {have} values, layer {g.layer} "
                    f"rows {g.row_start}:{g.row_end} need {need}"
                )
            chunks.append(tuple(p.view(np.uint8) for p in parts))
        else:
            owner, sha, as_of = inherit[i]
            chunks.append(Inherited(owner))
            entry["in"], entry["sha256"] = owner, sha
            if as_of is not None:
                entry["as_of"] = as_of
        entries.append(entry)
    states: dict[str, dict] = {}
    for kind in STATE_KINDS:
        scalars, arrays, data = _split_state(kind, getattr(ckpt, kind))
        states[kind] = {"scalars": scalars, "arrays": arrays}
        for name, raw in data:
            for start in range(0, raw.size, max_chunk_bytes):
                chunks.append((raw[start : start + max_chunk_bytes],))
                entries.append({"kind": kind, "name": name, "start": start})
    for e, c in zip(entries, chunks, strict=True):
        if isinstance(c, Inherited | LiveChunk):
            layer, (r0, r1) = e["layer"], e["rows"]
            e["nbytes"] = 4 * group_values(params.spec, NeuronGroup(layer, r0, r1))
        else:
            e["nbytes"] = sum(int(p.nbytes) for p in c)
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "version": int(ckpt.version),
        "created_at": float(ckpt.created_at),
        "spec": params.spec.to_dict(),
        "max_chunk_bytes": int(max_chunk_bytes),
        "metadata": dict(ckpt.metadata),
        "applied_results": [str(r) for r in ckpt.applied_results],
        "states": states,
        "chunks": entries,
    }
    if present is not None:
        assert isinstance(params, ParamsPatch | LiveParams) and params.base is not None
        manifest["base"] = int(params.base)
    return manifest, chunks


def _inheritance(
    version: int,
    patch: ParamsPatch | LiveParams,
    present: Collection[int],
    base: dict | None,
    groups: list[NeuronGroup],
    max_chunk_bytes: int,
) -> dict[int, tuple[int, str, int | None]]:
    """``chunk index -> (owner version, sha256, as_of)`` of every group the patch
    does not hold, from the base's manifest (same model and plan)."""
    assert patch.base is not None
    if base is None:
        raise ValueError(f"checkpoint v{version}: a params patch needs its base's manifest")
    if patch.base >= version or base.get("version") != patch.base:
        raise ValueError(
            f"checkpoint v{version}: patch base v{patch.base} (manifest of "
            f"v{base.get('version')}) must be an earlier checkpoint"
        )
    if base.get("spec") != patch.spec.to_dict() or base.get("max_chunk_bytes") != max_chunk_bytes:
        raise ValueError(
            f"checkpoint v{version}: base v{patch.base} has another model or chunk size"
        )
    extra = [i for i in present if not 0 <= i < len(groups)]
    if extra:
        raise ValueError(f"params patch: no neuron group {extra[0]} (the plan has {len(groups)})")
    out = {}
    for i, e in enumerate(base["chunks"][: len(groups)]):
        if i not in present:
            out[i] = (int(e.get("in", patch.base)), str(e["sha256"]), e.get("as_of"))
    return out


def seal(manifest: dict, hashes: Iterable[str | None]) -> tuple[bytes, str]:
    """Put chunk hashes into the manifest (None: an inherited chunk's entry already
    has its own); return the manifest's bytes and their sha256."""
    for e, h in zip(manifest["chunks"], hashes, strict=True):
        if h is not None:
            e["sha256"] = h
    blob = json.dumps(manifest, separators=(",", ":"), allow_nan=True).encode()
    return blob, sha256_hex(blob)


def parse_manifest(version: int, blob: bytes, expected_sha256: str) -> dict:
    if sha256_hex(blob) != expected_sha256:
        raise CorruptCheckpoint(version, "manifest checksum mismatch")
    try:
        manifest = json.loads(blob)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpoint(version, f"manifest is not JSON ({exc})") from None
    if manifest.get("format") != FORMAT or manifest.get("format_version") not in READABLE_FORMATS:
        raise CorruptCheckpoint(
            version,
            f"format {manifest.get('format')!r} v{manifest.get('format_version')}, "
            f"expected {FORMAT!r} v{READABLE_FORMATS}",
        )
    if manifest.get("version") != version:
        raise CorruptCheckpoint(version, f"manifest says version {manifest.get('version')}")
    return manifest


def decode(
    version: int,
    manifest: dict,
    chunks: Iterator[tuple[int, bytes]],
    pool: Executor | None = None,
    into: Params | None = None,
) -> Checkpoint:
    """Rebuild a checkpoint from its chunks, verifying every sha256.

    With a ``pool`` the hashing of chunk i overlaps the read of chunk i+1 (hashlib
    releases the GIL on large buffers). ``into``: params of the same spec to fill
    (a mapped model) instead of a new buffer. Raises ``CorruptCheckpoint`` naming
    the chunk.
    """
    try:
        spec = ModelSpec.from_dict(manifest["spec"])
        entries = manifest["chunks"]
        states_meta = manifest["states"]
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptCheckpoint(
            version, f"manifest is missing or has a bad field ({exc})"
        ) from None
    if into is not None and into.spec.widths != spec.widths:
        raise ValueError(
            f"checkpoint v{version}: widths {list(spec.widths)}, the params to fill "
            f"have {list(into.spec.widths)}"
        )
    params = Params(spec) if into is None else into
    states: dict[str, dict[str, Any]] = {}
    dests: dict[tuple[str, str], np.ndarray] = {}
    for kind in STATE_KINDS:
        meta = states_meta.get(kind, {"scalars": {}, "arrays": {}})
        states[kind] = dict(meta["scalars"])
        for name, a in meta["arrays"].items():
            arr = np.empty(a["shape"], dtype=np.dtype(a["dtype"]))
            states[kind][name] = arr
            dests[(kind, name)] = arr.reshape(-1).view(np.uint8)
    pending = []
    as_of: list[int] = []
    seen = 0
    for idx, data in chunks:
        if idx != seen or idx >= len(entries):
            raise CorruptCheckpoint(version, f"chunk {seen} missing (found index {idx})")
        e = entries[idx]
        if len(data) != e["nbytes"]:
            raise CorruptCheckpoint(
                version, f"chunk {idx} has {len(data)} bytes, manifest says {e['nbytes']}"
            )
        pending.append(pool.submit(sha256_hex, data) if pool else sha256_hex(data))
        src = np.frombuffer(data, dtype=np.uint8)
        if e["kind"] == "params":
            g = NeuronGroup(e["layer"], e["rows"][0], e["rows"][1])
            ws, bs = params.group_slices(g)
            vals = src.view(np.float32)
            nw = ws.stop - ws.start
            if vals.size != nw + (bs.stop - bs.start):
                raise CorruptCheckpoint(version, f"chunk {idx} does not fit group {g}")
            params.data[ws] = vals[:nw]
            params.data[bs] = vals[nw:]
            as_of.append(int(e.get("as_of", version)))
        else:
            dest = dests.get((e["kind"], e["name"]))
            if dest is None or e["start"] + src.size > dest.size:
                raise CorruptCheckpoint(version, f"chunk {idx} does not fit its state array")
            dest[e["start"] : e["start"] + src.size] = src
        seen += 1
    if seen != len(entries):
        raise CorruptCheckpoint(version, f"{len(entries) - seen} chunk(s) missing")
    for idx, (e, h) in enumerate(zip(entries, pending, strict=True)):
        got = h if isinstance(h, str) else h.result()
        if got != e["sha256"]:
            raise CorruptCheckpoint(version, f"chunk {idx} ({_describe(e)}) checksum mismatch")
    return Checkpoint(
        version=version,
        created_at=float(manifest["created_at"]),
        params=params,
        optimizer=states["optimizer"],
        strategy=states["strategy"],
        metadata=manifest.get("metadata", {}),
        applied_results=tuple(manifest.get("applied_results", ())),
        as_of=tuple(as_of),
    )


def _describe(e: dict) -> str:
    if e["kind"] == "params":
        return f"layer {e['layer']} rows {e['rows'][0]}:{e['rows'][1]}"
    return f"{e['kind']} {e['name']} @ {e['start']}"
