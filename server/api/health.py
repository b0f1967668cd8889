"""Liveness and readiness: `GET /healthz` (process up) and `GET /readyz` (database reachable)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from server.api.deps import SessionDep, StrictQuery
from server.api.errors import UNAVAILABLE
from server.errors import ServiceUnavailableError

router = APIRouter(tags=["health"], dependencies=[StrictQuery])


class Health(BaseModel):
    status: str


@router.get("/healthz")
def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", responses={**UNAVAILABLE})
def readyz(session: SessionDep) -> Health:
    try:
        session.execute(text("SELECT 1"))
    except SQLAlchemyError as e:
        raise ServiceUnavailableError(f"database unreachable: {e.__class__.__name__}",
                                      fix="check MODELFLEET_DATABASE_URL and the database") from e
    return Health(status="ok")
