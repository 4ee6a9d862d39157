"""Credit over HTTP: the leaderboard and one volunteer's account, for a game server.

``GET /api/credit?offset=&limit=`` pages the volunteers by granted FLOPs;
``GET /api/credit/{volunteer}`` is one account by its public id (the id
``welcome.volunteer`` told the client), 404 if unknown. Both read the core on
its own thread and are in the OpenAPI schema; nothing here needs the admin token:
credit is public, as BOINC's is.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, HTTPException, Query
from pydantic import BaseModel, Field

from coordinator.runtime.service import ServiceStopped

if TYPE_CHECKING:
    from coordinator.http.server import CrowdServer

#: most rows one page of the leaderboard holds
PAGE_MAX = 500


class VolunteerCredit(BaseModel):
    rank: int = Field(description="1 for the most FLOPs granted")
    volunteer: str = Field(description="public id of the volunteer's key (16 hex digits)")
    name: str = Field(description="the display name it gave last")
    flops: float = Field(description="FLOPs of its accepted work, granted")
    pending_flops: float = Field(description="accepted, not checked yet (replication on)")
    results: int = Field(description="results granted")
    forfeited: int = Field(description="results lost to a wrong copy or a proven lie")
    excluded: bool = Field(description="caught lying: all credit forfeited, none earned since")


class CreditPage(BaseModel):
    total: int = Field(description="volunteers with an account")
    offset: int
    limit: int
    total_flops: float = Field(description="FLOPs granted to all volunteers")
    volunteers: list[VolunteerCredit]


async def _on_core(crowd: CrowdServer, fn: Any) -> Any:
    crowd.ensure_started()
    try:
        return await asyncio.wrap_future(crowd.service.call(fn))
    except ServiceStopped:
        raise HTTPException(503, "the coordinator is stopping") from None


def add_credit_routes(app: FastAPI, crowd: CrowdServer) -> None:
    @app.get("/api/credit", response_model=CreditPage)
    async def credit_page(
        offset: int = Query(0, ge=0), limit: int = Query(50, ge=1, le=PAGE_MAX)
    ) -> dict[str, Any]:
        """The leaderboard: volunteers by FLOPs granted, most first."""

        def read(core: Any) -> dict[str, Any]:
            total, rows = core.credit.page(offset, limit)
            return {
                "total": total,
                "offset": offset,
                "limit": limit,
                "total_flops": core.credit.total(),
                "volunteers": rows,
            }

        return await _on_core(crowd, read)

    @app.get("/api/credit/{volunteer}", response_model=VolunteerCredit)
    async def credit_of(volunteer: str) -> dict[str, Any]:
        """One volunteer's account by its public id, with its rank."""
        row = await _on_core(crowd, lambda core: core.credit.one(volunteer[:64]))
        if row is None:
            raise HTTPException(404, f"no volunteer {volunteer[:64]!r} has credit here")
        return row
