"""Readiness: whether the database answers."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from server.errors import ServiceUnavailableError


def check_database(session: Session) -> None:
    """ServiceUnavailableError (503) naming the fix when the database does not answer."""
    try:
        session.execute(text("SELECT 1"))
    except SQLAlchemyError as e:
        raise ServiceUnavailableError(f"database unreachable: {e.__class__.__name__}",
                                      fix="check MODELFLEET_DATABASE_URL and the database") from e
