"""Liveness and readiness: `GET /healthz` (the process answers) and `GET /readyz` (the
database, the blob store and the job queue answer; 503 naming each one that does not, with
the fix: server/services/readiness.py)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from server.api.deps import BlobStoreDep, JobQueueDep, SessionDep, StrictQuery
from server.api.errors import UNAVAILABLE
from server.services.readiness import check_ready

router = APIRouter(tags=["health"], dependencies=[StrictQuery])


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str
    checks: dict[str, str]  # dependency -> "ok"


@router.get("/healthz")
def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", responses={**UNAVAILABLE})
def readyz(session: SessionDep, store: BlobStoreDep, queue: JobQueueDep) -> Readiness:
    return Readiness(status="ok", checks=check_ready(session, store, queue))
