"""The handshake: what the coordinator checks in a ``hello`` and answers in
``welcome`` (docs/protocol.md §3.1, §3.2, §6, §9).

A hello the job cannot serve raises ``ProtocolError``, which the core answers
with an error frame and a Close (the peer's fault: an old build, a missing
codec). A hello it can serve opens a :class:`~coordinator.core.connections.Conn`
that remembers what the client said it can do: deltas, the portable seeded
init, spanning chunks, shards by hash.
"""

from __future__ import annotations

from compression import CodecError
from compression import get as get_codec
from coordinator.core.config import JobConfig
from coordinator.core.connections import Conn
from coordinator.core.linkcodecs import LinkCodecs, link_bound, listed
from coordinator.core.linkcodecs import choose as choose_codecs
from coordinator.core.uploads import Uploads
from nn.spec import INIT_SCHEME, ModelSpec
from protocol import messages as m
from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import LinkLimits
from protocol.limits import profile as link_profile

#: rows a layer-split boundary may add to a result's chunks (one shard's)
MAX_BOUNDARY_ROWS = 1 << 16


def server_limits(job: JobConfig) -> LinkLimits:
    """The job's link profile with its explicit overrides applied."""
    base = link_profile(job.link.profile)
    return LinkLimits(
        bytes_per_s=job.link.bytes_per_s or base.bytes_per_s,
        messages_per_s=job.link.messages_per_s or base.messages_per_s,
        max_message_bytes=job.link.max_message_bytes or base.max_message_bytes,
        burst=base.burst,
    )


def _codec_id(name: str) -> int:
    return int(get_codec(name).id)


def _codec_ids(names: tuple[str, ...]) -> set[int]:
    """Wire ids of the codecs a peer named (a parameterised name stands for its
    whole id: the layout does not depend on the parameter); unknown names skip."""
    ids = set()
    for name in names:
        try:
            ids.add(_codec_id(name))
        except CodecError:
            continue
    return ids


def check_hello(job: JobConfig, hello: m.Hello, *, data_only: bool) -> tuple[int, set[int]]:
    """The protocol version to speak and the wire ids of the codecs the client
    decodes; raises ``ProtocolError`` for a hello this job cannot serve.
    ``data_only``: the job's rows reach clients only as shards by hash (§13)."""
    version = m.choose_version(hello.version)
    offered = _codec_ids(hello.codecs)
    missing = [c for c in (job.codecs.model, job.codecs.update) if not listed(c, offered)]
    if missing:
        raise ProtocolError(ErrorCode.BAD_FIELD, f"hello.codecs: job needs {sorted(missing)}")
    if data_only and not hello.data:
        raise ProtocolError(
            ErrorCode.BAD_FIELD,
            "hello.data: this job's data comes from the coordinator; the client must "
            "fetch shards by hash (docs/protocol.md §13)",
        )
    return version, offered


def open_conn(
    job: JobConfig,
    spec: ModelSpec,
    client_id: str,
    hello: m.Hello,
    limits: LinkLimits,
    offered: set[int],
    *,
    seeded_v0: bool,
    serves_prefetch: bool,
) -> Conn:
    """A connection under the negotiated ``limits``, with what the checked hello
    says the client can do, the codecs its link gets (linkcodecs.py) and whether
    it is offered prefetch. ``seeded_v0``: this coordinator's version 0 is the
    job's init seed's, so a client with the portable scheme builds it itself.
    ``serves_prefetch``: the job and its strategy allow prefetch at all."""
    # A layer-split lower result also carries its shard's boundary rows.
    extra = MAX_BOUNDARY_ROWS if job.split.enabled else 0
    codecs = choose_codecs(job, spec, limits, offered)
    conn = Conn(client_id, limits, Uploads(spec, codecs.update, extra_rows=extra), codecs)
    conn.deltas = hello.deltas and codecs.delta is not None and listed(codecs.delta, offered)
    conn.seeded_init = INIT_SCHEME in hello.init_schemes and seeded_v0
    conn.spans = hello.spans
    conn.data = hello.data
    conn.boundary = hello.boundary and job.split.enabled
    conn.prefetch = serves_prefetch and offers_prefetch(job, codecs, limits)
    return conn


def offers_prefetch(job: JobConfig, codecs: LinkCodecs, limits: LinkLimits) -> bool:
    """Whether a connection of a job that serves prefetch is offered it: under
    ``lease.prefetch = "auto"`` only where the link, in its codecs, sets the
    task's length (and the core serves a prefetch only where the running task
    hides a download: TaskIssuer.prefetch_pays). There the next task's model
    downloads and the last result uploads while the client computes; on lan a
    transfer hides nothing and the queued task's model one result older cost 2
    clients half their work (docs/performance.md, "Session 6" and "Session 15")."""
    if job.lease.prefetch != "auto":
        return bool(job.lease.prefetch)
    if job.submodel.enabled or job.split.enabled:
        return False  # a slice's compute, which TaskIssuer.prefetch_pays does not see
    return link_bound(job, codecs.round_trip_bytes, limits)


def welcome(
    job: JobConfig,
    *,
    version: int,
    session_id: str,
    resume_token: str,
    limits: LinkLimits,
    prefetch: bool,
    volunteer: str = "",
) -> m.Welcome:
    """The answer to an accepted hello: what this coordinator serves (it takes
    spanning chunks, serves shards by hash and takes declines)."""
    return m.Welcome(
        version=version,
        session_id=session_id,
        resume_token=resume_token,
        limits=limits,
        heartbeat_interval=job.lease.heartbeat_interval_s,
        spans=True,
        prefetch=prefetch,
        data=True,
        decline=True,
        job=job.name[:128],
        volunteer=volunteer,
    )
