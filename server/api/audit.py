"""`GET /v1/audit`: who did what, when (newest first, paged by `before_id`)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel

from server.api.deps import SessionDep, StrictQuery, TokenPrincipal
from server.api.errors import AUTH_ERRORS
from server.db import audit

router = APIRouter(prefix="/v1", tags=["audit"], dependencies=[StrictQuery])


class AuditEventPublic(BaseModel):
    id: int
    at: datetime
    actor: str
    action: str
    target: str
    details: dict[str, Any]


class AuditPage(BaseModel):
    events: list[AuditEventPublic]
    next_before_id: int | None  # pass as before_id for the next (older) page


@router.get("/audit", responses={**AUTH_ERRORS})
def list_audit(
    session: SessionDep,
    _principal: TokenPrincipal,
    limit: Annotated[int, Query(ge=1, le=audit.MAX_AUDIT_PAGE)] = 100,
    before_id: Annotated[int | None, Query(ge=1, le=2**62)] = None,
    action: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
    target_prefix: Annotated[str | None, Query(min_length=1, max_length=255)] = None,
) -> AuditPage:
    """Audit events, newest first. Any valid token may read them."""
    events = audit.list_events(
        session, limit=limit, before_id=before_id, action=action, target_prefix=target_prefix
    )
    return AuditPage(
        events=[
            AuditEventPublic(id=e.id, at=e.at, actor=e.actor, action=e.action, target=e.target,
                             details=e.details)
            for e in events
        ],
        next_before_id=events[-1].id if len(events) == limit else None,
    )
