"""Liveness and readiness: `GET /healthz` (process up) and `GET /readyz` (database reachable)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel
from sqlalchemy import text

from server.api.deps import SessionDep, StrictQuery
from server.api.errors import UNAVAILABLE

router = APIRouter(tags=["health"], dependencies=[StrictQuery])


class Health(BaseModel):
    status: str


@router.get("/healthz")
def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", responses={**UNAVAILABLE})
def readyz(session: SessionDep) -> Health:
    session.execute(text("SELECT 1"))
    return Health(status="ok")
