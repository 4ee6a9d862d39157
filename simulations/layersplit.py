"""Layer-split training on two simulated clients, with the coordinator as a relay.

Client *first* holds the data and block 0 of the network; client *second* holds block 1 (the
network's top) and no data. Per slice of ``slice_batches`` mini-batches, first runs DGL's
forward-and-step on each batch (nn.layersplit) and sends the boundary activations ``h`` ``[rows,
width]`` and the labels ``y`` ``[rows]`` as one chunked transfer
(``protocol.chunking.chunk_named``, frames sent when ``protocol.limits.Pacer`` allows).
:class:`Relay` validates every frame against the transfer it planned (a Reassembler) and
forwards it unchanged to second, which reassembles the slice, steps on its batches in order and
acknowledges it with an ``ack`` the relay forwards back. first runs at most ``window``
unacknowledged slices ahead, which bounds what the relay and second hold.

Time: each direction of each link is a ``simulations.network.Channel``; compute takes FLOPs /
``flops_per_s``; the only feedback is the ack window, so one pass in slice order computes every
time (no event heap). With a lossless codec (fp32) the blocks end bit-identical to
``train_split`` with the same seed; fp16 halves the bytes and rounds what second sees. The real
coordinator trains the same blocks with ordinary tasks (coordinator/core/layersplit.py); the
figures: docs/simulations.md ("Layer-split training").
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from nn.layersplit import (
    BATCH_STREAM,
    BlockTrainer,
    batch_sizes,
    epoch_batches,
    init_blocks,
    joined,
)
from nn.optim import Optimizer
from nn.params import Params
from nn.rng import Xoshiro128ss
from nn.spec import ModelSpec
from protocol import messages as m
from protocol.chunking import chunk_named, encode_params
from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import PROFILES, LinkLimits, Pacer
from protocol.reassembly import Reassembler
from simulations.distributions import Fixed
from simulations.network import Channel

#: a player's compute rate (docs/simulations.md, "Compute rates")
PLAYER_FLOPS = 5e9
#: the four one-way paths, in the order a slice uses them
DIRECTIONS = ("first_up", "second_down", "second_up", "first_down")


class Role(enum.Enum):
    FIRST = "first"
    SECOND = "second"


@dataclass(frozen=True, slots=True, kw_only=True)
class Forward:
    """Send ``frame`` to ``to`` unchanged."""

    to: Role
    frame: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Refuse:
    """``who`` misbehaved: close it with ``code`` (the peer's fault, never raised)."""

    who: Role
    code: ErrorCode
    reason: str


class Relay:
    """The coordinator's part: IO-free, no clock.

    Call order: ``expect(transfer, shapes)`` for each slice it planned, then
    ``receive(sender, frame)`` for every frame either client sends; it returns
    what to do. A chunk from first is validated (it must belong to an expected
    transfer, fit second's frame limit and its Reassembler) and forwarded; an
    ack from second for a completed transfer goes back to first. Anything else
    is a Refuse of its sender.
    """

    def __init__(self, *, first: LinkLimits, second: LinkLimits) -> None:
        self.limits = {Role.FIRST: first, Role.SECOND: second}
        self._open: dict[str, Reassembler] = {}
        self._awaiting_ack: set[str] = set()

    def expect(self, transfer: str, shapes: Mapping[str, tuple[int, ...]]) -> None:
        self._open[transfer] = Reassembler.for_named(shapes, transfer=transfer)

    def receive(self, sender: Role, frame: bytes) -> list[Forward | Refuse]:
        try:
            msg = m.decode(frame, max_bytes=self.limits[sender].max_message_bytes)
            if sender is Role.FIRST and isinstance(msg, m.Chunk):
                return [self._chunk(msg, frame)]
            if sender is Role.SECOND and isinstance(msg, m.Ack):
                if msg.task_id not in self._awaiting_ack:
                    raise ProtocolError(ErrorCode.UNKNOWN_TASK, f"ack: {msg.task_id!r} not sent")
                self._awaiting_ack.discard(msg.task_id)
                return [Forward(to=Role.FIRST, frame=frame)]
            raise ProtocolError(ErrorCode.UNEXPECTED, f"{msg.TYPE} from {sender.value}")
        except ProtocolError as exc:
            return [Refuse(who=sender, code=exc.code, reason=exc.message)]

    def _chunk(self, chunk: m.Chunk, frame: bytes) -> Forward:
        reasm = self._open.get(chunk.transfer)
        if reasm is None:
            raise ProtocolError(ErrorCode.UNKNOWN_TASK, f"transfer {chunk.transfer!r}")
        if len(frame) > self.limits[Role.SECOND].max_message_bytes:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"frame of {len(frame)} bytes for second")
        reasm.add(chunk)
        if reasm.done:
            del self._open[chunk.transfer]
            self._awaiting_ack.add(chunk.transfer)
        return Forward(to=Role.SECOND, frame=frame)


@dataclass(frozen=True, slots=True, kw_only=True)
class SplitConfig:
    """How the two clients train and talk; both links get ``link``."""

    epochs: int
    batch: int
    slice_batches: int = 4
    codec: str = "fp32"
    link: LinkLimits = PROFILES["roblox"]
    latency_s: float = 0.0
    flops_per_s: float = PLAYER_FLOPS
    window: int = 2

    def __post_init__(self) -> None:
        for name in ("epochs", "batch", "slice_batches", "window"):
            if getattr(self, name) < 1:
                raise ValueError(f"layer split: {name} must be >= 1, got {getattr(self, name)}")
        if not self.flops_per_s > 0 or not self.latency_s >= 0:
            raise ValueError("layer split: flops_per_s must be > 0 and latency_s >= 0")


@dataclass(slots=True)
class Tally:
    frames: int = 0
    bytes: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class EpochStats:
    """One epoch's traffic per direction and when its last ack reached first."""

    epoch: int
    end_s: float
    traffic: dict[str, Tally] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class SplitResult:
    blocks: list[BlockTrainer]
    params: Params
    epochs: list[EpochStats]
    collect_bytes: int
    """Frames of both blocks' weights sent once to the coordinator (to assemble
    or checkpoint the model): not per epoch."""

    @property
    def seconds(self) -> float:
        return self.epochs[-1].end_s if self.epochs else 0.0


def _paced(pacer: Pacer, nbytes: int, now: float) -> float:
    """Send time of a frame ready at ``now`` (the pacer's clock only moves forward)."""
    t = pacer.next_send_time(nbytes, now)
    pacer.consume(nbytes, t)
    return t


class _Path:
    """One one-way path: the sender's pacer, the wire's channel, the tally."""

    __slots__ = ("channel", "clock", "pacer", "tally")

    def __init__(self, limits: LinkLimits, latency_s: float) -> None:
        self.pacer = Pacer(limits)
        # not LinkSpec.from_limits: it cannot take the unlimited profile's inf burst
        self.channel = Channel(
            bandwidth=limits.bytes_per_s,
            messages_per_s=limits.messages_per_s,
            burst=int(min(limits.burst_messages, 1 << 30)),
            max_frame_bytes=limits.max_message_bytes,
            latency=Fixed(value=latency_s),
            rng=np.random.default_rng(0),  # unused: the latency is fixed
        )
        self.clock = -math.inf
        self.tally = Tally()

    def send(self, frame: bytes, ready: float) -> float:
        """Pace and put ``frame`` on the wire once ready; return its arrival time."""
        self.clock = _paced(self.pacer, len(frame), max(ready, self.clock))
        self.tally.frames += 1
        self.tally.bytes += len(frame)
        return self.channel.send(self.clock, len(frame))


def _accept(actions: list[Forward | Refuse], to: Role) -> list[bytes]:
    """The frames the relay forwards to ``to``; a refusal here is the simulator's bug."""
    for a in actions:
        if isinstance(a, Refuse):
            raise RuntimeError(f"relay refused {a.who.value}: {a.code.name}: {a.reason}")
    return [a.frame for a in actions if isinstance(a, Forward) and a.to is to]


def simulate(
    spec: ModelSpec,
    cut: int,
    X: np.ndarray,
    y: np.ndarray,
    *,
    config: SplitConfig,
    optimizer: Optimizer,
    seed: int,
) -> SplitResult:
    """Train ``spec`` cut at layer ``cut`` on two clients; see the module docstring."""
    first, second = init_blocks(spec, (cut,), seed=seed, optimizer=optimizer)
    lim = config.link
    paths = {d: _Path(lim, config.latency_s) for d in DIRECTIONS}
    relay = Relay(first=lim, second=lim)
    flops1 = first.spec.flops_per_sample() + first.block.flops_per_sample(train=False)
    flops2 = second.spec.flops_per_sample()
    rng = Xoshiro128ss(seed, BATCH_STREAM)
    sizes = batch_sizes(len(X), config.batch)  # what second knows of the batches: the job's
    acks: list[float] = []  # when slice s's ack reached first
    t_first = t_second = 0.0
    epochs: list[EpochStats] = []
    for e in range(config.epochs):
        before = {d: Tally(p.tally.frames, p.tally.bytes) for d, p in paths.items()}
        batches = epoch_batches(len(X), config.batch, rng)
        for j in range(0, len(batches), config.slice_batches):
            group = batches[j : j + config.slice_batches]
            s = len(acks)
            start = t_first if s < config.window else max(t_first, acks[s - config.window])
            hs = [first.forward_and_step(X[idx], y[idx]) for idx in group]
            rows = [len(idx) for idx in group]
            t_first = start + sum(rows) * flops1 / config.flops_per_s
            transfer = f"layersplit/{e}/{j // config.slice_batches}"
            arrays = {
                "h": np.concatenate(hs),
                "y": y[np.concatenate(group)].astype(np.float32),
            }
            ready, got = _send_slice(relay, paths, transfer, arrays, t_first, config)
            t_second = max(t_second, ready)
            h, labels = got[(0, "h")], got[(1, "y")].astype(np.int64)
            at = 0
            for r in sizes[j : j + config.slice_batches]:
                second.step(h[at : at + r], labels[at : at + r])
                at += r
            if at != len(h):
                raise RuntimeError(f"{transfer}: {len(h)} rows, the job's batches have {at}")
            t_second += at * flops2 / config.flops_per_s
            ack = m.encode(m.Ack(task_id=transfer, accepted=True))
            arrive = paths["second_up"].send(ack, t_second)
            for frame in _accept(relay.receive(Role.SECOND, ack), Role.FIRST):
                acks.append(paths["first_down"].send(frame, arrive))
        traffic = {
            d: Tally(p.tally.frames - before[d].frames, p.tally.bytes - before[d].bytes)
            for d, p in paths.items()
        }
        epochs.append(EpochStats(epoch=e, end_s=max(acks[-1], t_second), traffic=traffic))
    collect = sum(
        len(f)
        for b in (first, second)
        for f in encode_params(
            b.block_params,
            max_message_bytes=lim.max_message_bytes,
            target_bytes=lim.frame_bytes,
            transfer=f"layersplit/block{b.index}",
        )
    )
    return SplitResult(
        blocks=[first, second],
        params=joined(spec, [first, second]),
        epochs=epochs,
        collect_bytes=collect,
    )


def _send_slice(
    relay: Relay,
    paths: Mapping[str, _Path],
    transfer: str,
    arrays: Mapping[str, np.ndarray],
    ready: float,
    config: SplitConfig,
) -> tuple[float, dict[tuple[int, str], np.ndarray]]:
    """first → relay → second for one slice; returns when second has it all, and
    what second reassembled."""
    shapes = {k: a.shape for k, a in arrays.items()}
    relay.expect(transfer, shapes)
    at_second = Reassembler.for_named(shapes, transfer=transfer)
    chunks = chunk_named(
        arrays,
        max_message_bytes=config.link.max_message_bytes,
        codec=config.codec,
        transfer=transfer,
        target_bytes=config.link.frame_bytes,
        spans=True,
    )
    last = ready
    for chunk in chunks:
        frame = m.encode(chunk)
        arrive = paths["first_up"].send(frame, ready)
        for fwd in _accept(relay.receive(Role.FIRST, frame), Role.SECOND):
            last = paths["second_down"].send(fwd, arrive)
            msg = m.decode(fwd)
            if not isinstance(msg, m.Chunk):
                raise RuntimeError(f"relay forwarded a {msg.TYPE} as boundary data")
            at_second.add(msg)
    return last, at_second.arrays()


def per_epoch(result: SplitResult) -> dict[str, dict[str, float]]:
    """Mean frames and bytes per epoch in each direction."""
    n = max(1, len(result.epochs))
    return {
        d: {
            "frames": sum(e.traffic[d].frames for e in result.epochs) / n,
            "bytes": sum(e.traffic[d].bytes for e in result.epochs) / n,
        }
        for d in DIRECTIONS
    }
