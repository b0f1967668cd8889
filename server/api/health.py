"""Liveness and readiness: `GET /healthz` (process up) and `GET /readyz` (database reachable)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from server.api.deps import SessionDep, StrictQuery
from server.api.errors import UNAVAILABLE
from server.services.health import check_database

router = APIRouter(tags=["health"], dependencies=[StrictQuery])


class Health(BaseModel):
    status: str


@router.get("/healthz")
def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", responses={**UNAVAILABLE})
def readyz(session: SessionDep) -> Health:
    check_database(session)
    return Health(status="ok")
