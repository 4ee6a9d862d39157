"""Codecs per connection: a client whose link sets its task's length moves fewer bytes.

A task sized ``tau = "auto"`` computes for ``task_seconds``, or for ``transfer_ratio``
times its transfers where that is longer (leases.task_steps). When the link wins,
the client spends most of its time on the link or on a task longer than the job
asks for, and every byte saved is training time: such a client gets the job's
``codecs.slow_link`` codecs for its full models, its deltas and its updates. Under
``auto`` that is int8 models and unbiased int4 (``int4-sr``) updates and deltas: a
model is used as it arrives, while an update or a delta is a step whose rounding
averages out over the crowd and the rounds. A result averaged in a round of at least
CROWD_MIN results goes up in ``int2-sr`` instead: its larger rounding noise shrinks
with the round. Every other client keeps the job's codecs, so a job on a fast link is
unchanged. Each direction falls back to the slow
model codec, and the whole link to the job's codecs, where the client's hello does
not list it (it is never refused for it). Deltas go where the job names a delta
codec and, under ``auto``, to every slow client that holds a version the core still
keeps (``delta_versions``): a round's volunteer always does.

The choice is made once a connection, from the link the handshake granted; the
lease remembers the update codec its task named, so a result is checked against
what its own task asked for. Measured in docs/performance.md ("Session 13",
"Session 19", "Session 21").
"""

from __future__ import annotations

from dataclasses import dataclass

from compression import get as get_codec
from coordinator.core.config import JobConfig
from coordinator.core.submodel import encoded_bytes
from nn.spec import ModelSpec
from protocol.limits import LinkLimits


@dataclass(frozen=True, slots=True)
class SlowCodecs:
    """The codecs of a slow link's full models, updates and deltas."""

    model: str
    update: str
    delta: str
    #: the update codec of a result averaged in a round of at least CROWD_MIN results
    crowd: str | None = None

    def names(self) -> tuple[str, ...]:
        """Each codec once: what a client must list to be given them all."""
        named = (self.model, self.update, self.delta, self.crowd)
        return tuple(dict.fromkeys(c for c in named if c is not None))


#: what ``codecs.slow_link = "auto"`` means where the job allows it
AUTO_SLOW = SlowCodecs(model="int8", update="int4-sr", delta="int4-sr", crowd="int2-sr")
#: the fewest results a round may close with for its updates to come in ``crowd``:
#: at 700 players int2-sr rounds reach 0.85 in as many rounds as int4-sr, at 256
#: they need 3 more (as many seconds), at 64 they need 7 more (docs/performance.md)
CROWD_MIN = 512
#: what the versions kept for ``auto``'s deltas may take, all together
AUTO_DELTA_BYTES = 256 << 20


@dataclass(frozen=True, slots=True)
class LinkCodecs:
    """The codecs of one connection's transfers, and a whole model's bytes in them."""

    model: str
    update: str
    delta: str | None
    model_bytes: int
    update_bytes: int
    #: the update codec in a round of at least CROWD_MIN results (None: ``update``)
    crowd: str | None = None
    crowd_bytes: int = 0

    @classmethod
    def of(
        cls, spec: ModelSpec, model: str, update: str, delta: str | None, crowd: str | None = None
    ) -> LinkCodecs:
        return cls(
            model,
            update,
            delta,
            encoded_bytes(spec, model),
            encoded_bytes(spec, update),
            crowd,
            encoded_bytes(spec, crowd) if crowd is not None else 0,
        )

    def update_for(self, averaged_with: int) -> tuple[str, int]:
        """The update codec of a task whose result is averaged with at least
        ``averaged_with`` results (Strategy.averaged_with), and a whole model's bytes in it."""
        if self.crowd is not None and averaged_with >= CROWD_MIN:
            return self.crowd, self.crowd_bytes
        return self.update, self.update_bytes

    @property
    def round_trip_bytes(self) -> int:
        """The model down and the update up: what a task's sizing counts as its transfer."""
        return self.model_bytes + self.update_bytes


def slow_codecs(job: JobConfig) -> SlowCodecs | None:
    """The codecs a slow client gets in this job, or None (every client on the job's).

    ``auto`` stays off where the job's results or slices depend on its own codecs:
    replication compares two clients' uploads bit for bit, a sub-model job sizes
    slices in its codecs, a layer-split job's boundary travels in its update codec;
    and where the operator already chose codecs other than fp32."""
    name = job.codecs.slow_link
    if name == "off":
        return None
    if name != "auto":
        return SlowCodecs(name, name, name)
    c = job.codecs
    own = c.model == "fp32" and c.update == "fp32" and c.delta in (None, "fp32")
    special = job.replication.enabled or job.submodel.enabled or job.split.enabled
    return AUTO_SLOW if own and not special else None


def delta_versions(job: JobConfig) -> int:
    """How many served versions the core keeps to send deltas from (0: none):
    ``codecs.delta_versions`` where the job names a delta codec; under ``auto``, for
    its slow clients' deltas, as many of those as fit AUTO_DELTA_BYTES (none below
    two)."""
    c = job.codecs
    if c.delta is not None:
        return c.delta_versions
    if slow_codecs(job) is not AUTO_SLOW:
        return 0
    kept = min(c.delta_versions, AUTO_DELTA_BYTES // job.spec.nbytes)
    return kept if kept >= 2 else 0


def sends_deltas(job: JobConfig) -> bool:
    """Whether the core sends deltas at all (delta_versions)."""
    return delta_versions(job) > 0


def link_bound(job: JobConfig, round_trip_bytes: int, limits: LinkLimits) -> bool:
    """Whether this link, not the client's compute, sets an auto-sized task's length:
    ``transfer_ratio`` times the round trip outlasts ``task_seconds``."""
    st = job.strategy
    transfer_s = round_trip_bytes / limits.bytes_per_s
    return st.transfer_ratio * transfer_s > st.task_seconds


def choose(job: JobConfig, spec: ModelSpec, limits: LinkLimits, offered: set[int]) -> LinkCodecs:
    """The codecs of a connection granted ``limits`` whose hello decodes the wire
    ids ``offered``: the job's, or the slow-link ones."""
    c = job.codecs
    own = LinkCodecs.of(spec, c.model, c.update, c.delta)
    slow = slow_codecs(job)
    if slow is None or not listed(slow.model, offered):
        return own
    if not link_bound(job, own.round_trip_bytes, limits):
        return own
    update = slow.update if listed(slow.update, offered) else slow.model
    crowd = slow.crowd if slow.crowd is not None and listed(slow.crowd, offered) else None
    delta = None
    if sends_deltas(job):
        delta = slow.delta if listed(slow.delta, offered) else slow.model
    return LinkCodecs.of(spec, slow.model, update, delta, crowd)


def listed(codec: str, offered: set[int]) -> bool:
    """Whether a hello that decodes the wire ids ``offered`` takes ``codec``."""
    return int(get_codec(codec).id) in offered
