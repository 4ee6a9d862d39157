"""The coordinator's HTTP side: every route but ``/ws`` (status, metrics, history,
the dashboard and its stream, shards by hash, the admin API, the volunteer page).

One home for what a person or a scraper reads; ``coordinator/http/server.py`` keeps
the websocket driver. Every function takes the :class:`CrowdServer` whose state
it shows; none of them touches a connection.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import mimetypes
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Header, HTTPException, Request, Response
from fastapi.responses import FileResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.staticfiles import StaticFiles

from client import WEB_ROOT
from coordinator.http import clientwheel
from coordinator.http.creditroutes import add_credit_routes
from coordinator.http.dashboard import estimate_left
from coordinator.runtime.service import ServiceStopped

if TYPE_CHECKING:
    from coordinator.core.strategies import Strategy
    from coordinator.http.server import CrowdServer


def status(crowd: CrowdServer) -> dict[str, Any]:
    """What /api/status shows (and the dashboard's tiles)."""
    st = crowd.service.stats
    job = crowd.service.job
    core = crowd.service.core
    return {
        "job": {
            "name": job.name,
            "strategy": job.strategy.name,
            "widths": list(job.spec.widths),
            "dataset": job.data.source,
            "target_accuracy": job.stop.target_accuracy,
        },
        "version": st.version,
        "clients": len(crowd.peers),
        "joined_clients": st.clients,
        "accepted_results": st.accepted,
        "rejected_results": st.rejected,
        "resent_results": st.resent,
        "leases_expired": st.leases_expired,
        "tasks_prefetched": st.tasks_prefetched,
        "tasks_declined": st.declined,
        "replication": st.replication,
        "upstream": st.upstream,
        "split": st.split,
        "data": {
            "shards": len(core.data.shards) if core is not None else None,
            "shard_bytes": core.data.total_bytes if core is not None else None,
            "ws_fetches": st.data_fetches,
            "ws_bytes": st.data_bytes,
            "http_fetches": st.data_http_fetches,
            "http_bytes": st.data_http_bytes,
        },
        "throughput": {"results_per_s": round(st.throughput(), 3)},
        "lr": None if core is None else lr_now(core.strategy),
        "last_evaluation": st.last_eval,
        "evaluations": {
            "count": st.evaluations,
            "seconds": round(st.evaluation_seconds, 3),
            "share_of_time": round(st.evaluation_share(), 4),
        },
        "finished": st.finished,
        "paused": st.paused,
        "checkpoints": {
            "written": st.checkpoints,
            "last": st.last_checkpoint,
            "last_seconds": st.last_checkpoint_s,
            "last_bytes": st.last_checkpoint_bytes,
            "last_base": st.last_checkpoint_base,
            "restored_from": st.restored_from,
            "journal": st.journal,
        },
        "network": {
            "frames_in": crowd.net.frames_in,
            "frames_out": crowd.net.frames_out,
            "bytes_in": crowd.net.bytes_in,
            "bytes_out": crowd.net.bytes_out,
            "refused": crowd.net.refused,
            "admission": {
                "addresses": len(crowd.admission.open),
                "over_per_address_bound": crowd.admission.refused_open,
                "handshake_timeouts": crowd.admission.timed_out,
                "sessions_too_fast": crowd.admission.refused_rate,
            },
            "slow_consumers_closed": crowd.net.slow_closed,
            "max_send_queue_bytes": crowd.net.max_queued,
        },
    }


def lr_now(strategy: Strategy) -> dict[str, Any]:
    """The next local task's lr multiplier and its parts: the crowd's scaling by
    its concurrency, the plateau cut, the cap from tasks that diverged (a task
    longer than ``max_scaled_steps / multiplier`` steps gets less). Read from
    the HTTP thread: plain numbers, each a moment old at worst."""
    cap = strategy.divergence.cap
    return {
        "multiplier": round(strategy.lr_scale(), 6),
        "concurrency": round(strategy.concurrency, 3),
        "plateau": strategy.lr_decay,
        "diverged_cap": None if math.isinf(cap) else cap,
        "diverged_cuts": strategy.divergence.cuts,
    }


def serve_blob(
    crowd: CrowdServer,
    blob: bytes,
    sha256: str,
    method: str,
    range_: str | None,
    if_none_match: str | None,
) -> Response:
    etag = f'"{sha256}"'
    headers = {
        "ETag": etag,
        "Cache-Control": "public, max-age=31536000, immutable",
        "Accept-Ranges": "bytes",
        # A page from another origin (a game embedding the volunteer page, a
        # tab pointed at this coordinator with ?ws=) fetches shards too; they
        # are public to anyone who may connect, and named by their hash.
        "Access-Control-Allow-Origin": "*",
        "Access-Control-Expose-Headers": "ETag, Content-Range, Content-Length",
    }
    if if_none_match is not None and etag in (t.strip() for t in if_none_match.split(",")):
        return Response(status_code=304, headers=headers)
    size = len(blob)
    start, end, status = 0, size, 200
    if range_ is not None:
        span = parse_range(range_, size)
        if span is None:
            headers["Content-Range"] = f"bytes */{size}"
            return Response(status_code=416, headers=headers)
        start, end, status = span[0], span[1], 206
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    body = b"" if method == "HEAD" else blob[start:end]
    if method != "HEAD":
        st = crowd.service.stats
        st.data_http_fetches += 1
        st.data_http_bytes += len(body)
        crowd.metrics.http_shard(len(body))
    headers["Content-Length"] = str(end - start)
    return Response(
        content=body, status_code=status, headers=headers, media_type="application/octet-stream"
    )


def dashboard_state(crowd: CrowdServer, since_event: int = 0) -> dict[str, Any]:
    core = crowd.service.core
    job = crowd.service.job
    st = crowd.service.stats

    def flops(client_id: str) -> float | None:
        rec = core.registry.get(client_id) if core is not None else None
        return None if rec is None else round(rec.rate(), 1)

    state = crowd.dashboard.snapshot(flops, since_event)
    hist = crowd.service.history
    vps = 0.0  # versions a second over the last half minute of samples
    recent = hist.throughput[-6:]
    if len(recent) >= 2 and recent[-1][0] > recent[0][0]:
        vps = (recent[-1][1] - recent[0][1]) / (recent[-1][0] - recent[0][0])
    now = time.time()
    state["status"] = status(crowd)
    state["left"] = estimate_left(
        now=now,
        started=now - (time.monotonic() - st.started),
        version=st.version,
        max_versions=job.stop.max_versions,
        max_time_s=job.stop.max_time_s,
        target_accuracy=job.stop.target_accuracy,
        evaluations=hist.evaluations,
        versions_per_s=vps,
    )
    state["link"] = job.link.profile
    return state


#: The admin API's actions, each ``POST /api/admin/<action>``.
ADMIN_ACTIONS = frozenset({"checkpoint", "pause", "resume", "stop"})


def admin_if_set(crowd: CrowdServer, authorization: str | None) -> None:
    """The admin token guards the operator's views only when one is set."""
    if crowd.admin_token is not None:
        admin(crowd, authorization)


def admin(crowd: CrowdServer, authorization: str | None) -> None:
    """The admin API's check: ``Authorization: Bearer <token>`` (403 without a token
    set, 401 for a missing, malformed or wrong one)."""
    if crowd.admin_token is None:
        raise HTTPException(403, "admin API disabled: start with an admin token")
    scheme, _, given = (authorization or "").strip().partition(" ")
    # RFC 7235: the scheme is case-insensitive; a bare token (no scheme) is refused.
    if scheme.lower() != "bearer" or not given.strip():
        raise HTTPException(
            401, "admin API: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )  # fmt: skip
    if not hmac.compare_digest(given.strip().encode(), crowd.admin_token.encode()):
        raise HTTPException(401, "admin token refused", headers={"WWW-Authenticate": "Bearer"})


def build_app(crowd: CrowdServer) -> FastAPI:
    app = FastAPI(
        title="crowdgrad coordinator",
        description="Websocket /ws speaks docs/protocol.md; the rest is JSON.",
        lifespan=crowd.lifespan,
    )

    add_credit_routes(app, crowd)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        """Liveness: the core thread is running (503 once it stopped)."""
        crowd.ensure_started()
        if crowd.service.stopped.is_set():
            raise HTTPException(503, "coordinator stopped")
        return {"ok": True, "version": crowd.service.stats.version}

    @app.get("/api/status")
    async def api_status() -> dict[str, Any]:
        """Job, model version, clients, throughput and the last evaluation."""
        crowd.ensure_started()
        return status(crowd)

    def shard_response(
        sha256: str, method: str, range_: str | None, if_none_match: str | None
    ) -> Response:
        crowd.ensure_started()
        core = crowd.service.core
        shard = core.data.by_hash.get(sha256) if core is not None else None
        if shard is None:
            raise HTTPException(404, f"no shard {sha256[:80]!r} in this job")
        return serve_blob(crowd, shard.blob, sha256, method, range_, if_none_match)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        """Prometheus exposition format (prometheus-client): results by outcome and
        reason, leases, clients by kind, frames and bytes by type, the task
        round-trip histogram, evaluation, checkpoints (docs/operations.md)."""
        crowd.ensure_started()
        return Response(crowd.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/dashboard", include_in_schema=False)
    async def dashboard_page() -> FileResponse:
        """The operator's page (client/web/page/dashboard.html); its data needs the
        admin token when one is set."""
        return FileResponse(WEB_ROOT / "dashboard.html", media_type="text/html")

    @app.get("/api/dashboard")
    async def dashboard(
        since_event: int = 0, authorization: str | None = Header(None)
    ) -> dict[str, Any]:
        """Everything the dashboard shows now: status, one row per client (name,
        kind, FLOP/s, tasks, accepted, rejected by reason, bytes, staleness),
        events after ``since_event``, and the estimated time left. Needs the admin
        token when one is set."""
        admin_if_set(crowd, authorization)
        crowd.ensure_started()
        return dashboard_state(crowd, since_event)

    @app.get("/api/dashboard/stream")
    async def dashboard_stream(
        request: Request, authorization: str | None = Header(None)
    ) -> StreamingResponse:
        """``/api/dashboard`` pushed once a second as server-sent events: each
        ``update`` carries the new events and history points only."""
        admin_if_set(crowd, authorization)
        crowd.ensure_started()

        async def updates() -> AsyncIterator[str]:
            last_event = 0
            since: dict[str, float | None] = {"evaluations": None, "throughput": None}
            while not await request.is_disconnected():
                state = dashboard_state(crowd, last_event)
                history = {}
                for part, last in since.items():  # each series from its own last point
                    history[part] = crowd.service.history.to_json(last)[part]
                    if history[part]["rows"]:
                        since[part] = history[part]["rows"][-1][0]
                state["history"] = history
                if state["events"]:
                    last_event = state["events"][-1]["id"]
                yield f"event: update\ndata: {json.dumps(state)}\n\n"
                if crowd.draining:
                    return
                await asyncio.sleep(1.0)

        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(updates(), media_type="text/event-stream", headers=headers)

    @app.get("/api/history")
    async def history(since: float | None = None) -> dict[str, Any]:
        """The run so far: ``evaluations`` (wall time, version, accuracy, loss at
        each evaluation) and ``throughput`` (sampled every 5 s: version, accepted
        and rejected results, clients, results/s, bytes in and out), each as
        ``{"fields": [...], "rows": [[...], ...]}``. Times are seconds since the
        epoch; ``since`` returns only later points. Kept in each checkpoint, so a
        restarted coordinator still has the series from the run's start."""
        crowd.ensure_started()
        return crowd.service.history.to_json(since)

    @app.get("/data/{sha256}")
    async def data(
        sha256: str,
        range_: str | None = Header(None, alias="range"),
        if_none_match: str | None = Header(None),
    ) -> Response:
        """A shard of the job's data by its sha256 (docs/protocol.md §13): immutable,
        so cacheable forever; ``Range: bytes=a-b`` gives part of it (206)."""
        return shard_response(sha256, "GET", range_, if_none_match)

    @app.head("/data/{sha256}")
    async def data_head(
        sha256: str,
        range_: str | None = Header(None, alias="range"),
        if_none_match: str | None = Header(None),
    ) -> Response:
        """The headers of ``GET /data/{sha256}`` alone."""
        return shard_response(sha256, "HEAD", range_, if_none_match)

    @app.post("/api/admin/checkpoint")
    async def checkpoint(authorization: str | None = Header(None)) -> dict[str, Any]:
        """Write a checkpoint now (needs a store); 503 once the coordinator is
        stopping (its stop writes the final checkpoint)."""
        admin(crowd, authorization)
        crowd.ensure_started()
        try:
            version = await asyncio.wrap_future(crowd.service.checkpoint_now())
        except ServiceStopped:
            raise HTTPException(
                503, "coordinator stopping: its stop writes the final checkpoint"
            ) from None
        if version is None:
            raise HTTPException(409, "no checkpoint store: start with --store PATH")
        return {"version": version}

    @app.post("/api/admin/pause")
    async def pause(authorization: str | None = Header(None)) -> dict[str, Any]:
        """Hold client results until resume (heartbeats keep flowing)."""
        admin(crowd, authorization)
        crowd.service.set_paused(True)
        return {"paused": True}

    @app.post("/api/admin/resume")
    async def resume(authorization: str | None = Header(None)) -> dict[str, Any]:
        admin(crowd, authorization)
        crowd.service.set_paused(False)
        return {"paused": False}

    @app.post("/api/admin/stop")
    async def stop(authorization: str | None = Header(None)) -> dict[str, Any]:
        """Checkpoint, close every client with 1001 and stop the coordinator."""
        admin(crowd, authorization)
        asyncio.get_running_loop().call_soon(crowd.stop_soon)
        return {"stopping": True}

    @app.api_route(
        "/api/admin/{action}",
        methods=["GET", "HEAD", "PUT", "PATCH", "DELETE"],
        include_in_schema=False,
    )
    async def admin_other_method(action: str) -> Response:
        """405 for an admin action asked with another method than POST (the volunteer
        page's mount below would answer 404, as if it did not exist)."""
        if action not in ADMIN_ACTIONS:
            raise HTTPException(404, f"no admin action {action[:80]!r}")
        raise HTTPException(405, "admin actions take POST", headers={"Allow": "POST"})

    clientwheel.add_routes(app, crowd)  # /client/: the desktop client as a wheel

    # The volunteer page (client/web): index.html at /, its bundles and the
    # WebAssembly kernels beside it. Mounted last, so the routes above win.
    if (WEB_ROOT / "index.html").is_file():
        # WebAssembly.instantiateStreaming needs this type; not every
        # system's mime.types has it.
        mimetypes.add_type("application/wasm", ".wasm")
        app.mount("/", StaticFiles(directory=WEB_ROOT, html=True), name="volunteer-page")
    return app


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """``[start, end)`` of one ``bytes=`` range (RFC 9110 §14.1.2), None when it is
    malformed, names several ranges or lies past the end."""
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash:
        return None
    try:
        if first == "":  # a suffix: the last N bytes
            n = int(last)
            return (max(0, size - n), size) if n > 0 and size > 0 else None
        start = int(first)
        end = size if last == "" else min(size, int(last) + 1)
    except ValueError:
        return None
    if start < 0 or start >= size or end <= start:
        return None
    return start, end
