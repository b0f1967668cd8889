"""Which database errors mean "the database is down or full" (docs/architecture.md "Outages").

A request that meets PostgreSQL stopped, restarting or unreachable, or SQLite busy or unable
to open its file, is answered 503 `database_unavailable` with Retry-After; a database whose
disk is full, 507 `database_full`. Any other database error (a bug, a constraint) stays a 500.
`classify` is the one place that tells them apart, for SQLAlchemy's wrapped errors and for
psycopg's own (the telemetry group commit talks to psycopg directly). Recovery needs nothing
here: the engine's pool pre-pings each connection it hands out (server/db/session.py), so the
first request after PostgreSQL is back gets a fresh connection.
"""

from __future__ import annotations

import sqlite3

import psycopg
from sqlalchemy.exc import DBAPIError

from server.errors import ServiceError, ServiceUnavailableError

RETRY_AFTER_SECONDS = 5

# What the error handlers catch (server/api/errors.py) and pass to `classify`.
DATABASE_ERRORS: tuple[type[Exception], ...] = (DBAPIError, psycopg.Error)

# PostgreSQL SQLSTATEs of a server that is going away or cannot take us now: connection
# exceptions (class 08), admin/crash shutdown, starting up, too many connections.
_PG_DOWN_CLASSES = ("08",)
_PG_DOWN_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})
_PG_FULL_STATES = frozenset({"53100"})  # disk_full
# SQLite result codes: busy, locked, I/O error, cannot open; full.
_SQLITE_DOWN_CODES = frozenset({5, 6, 10, 14})
_SQLITE_FULL = 13


class DatabaseUnavailableError(ServiceUnavailableError):
    code = "database_unavailable"


class DatabaseFullError(ServiceError):
    status_code = 507
    code = "database_full"


def classify(error: BaseException) -> ServiceError | None:
    """The service error to answer `error` with, or None when it is not an outage."""
    orig = error.orig if isinstance(error, DBAPIError) else error
    invalidated = isinstance(error, DBAPIError) and error.connection_invalidated
    if isinstance(orig, psycopg.Error):
        state = orig.sqlstate
        if state in _PG_FULL_STATES:
            return _full(f"PostgreSQL: {first_line(orig)}")
        down = state is not None and (state.startswith(_PG_DOWN_CLASSES)
                                      or state in _PG_DOWN_STATES)
        # No SQLSTATE on a connection error: a client-side failure (refused, reset, closed
        # under us) — the server is gone. A client-side programming error is not an outage.
        lost = state is None and isinstance(orig, (psycopg.OperationalError,
                                                   psycopg.InterfaceError))
        if invalidated or down or lost:
            return _down(f"PostgreSQL: {first_line(orig)}")
        return None
    if isinstance(orig, sqlite3.Error):
        code = getattr(orig, "sqlite_errorcode", None)
        primary = code & 0xFF if isinstance(code, int) else None
        if primary == _SQLITE_FULL:
            return _full(f"SQLite: {first_line(orig)}")
        if primary in _SQLITE_DOWN_CODES or invalidated:
            return _down(f"SQLite: {first_line(orig)}")
    return None


def is_transient_conflict(error: BaseException) -> bool:
    """Another writer got in the way — SQLite busy or locked, a PostgreSQL deadlock or
    serialization failure (SQLSTATE class 40): worth retrying the transaction at once,
    unlike an outage."""
    orig = error.orig if isinstance(error, DBAPIError) else error
    if isinstance(orig, psycopg.Error):
        return (orig.sqlstate or "").startswith("40")
    code = getattr(orig, "sqlite_errorcode", None)
    return isinstance(orig, sqlite3.Error) and isinstance(code, int) and code & 0xFF in (5, 6)


def _down(reason: str) -> DatabaseUnavailableError:
    return DatabaseUnavailableError(
        f"the database is unavailable ({reason}); nothing was changed by this request",
        fix=f"retry after {RETRY_AFTER_SECONDS} s; operators: check that the database is up "
        "and MODELFLEET_DATABASE_URL reaches it (GET /readyz)",
        retry_after=RETRY_AFTER_SECONDS)


def _full(reason: str) -> DatabaseFullError:
    return DatabaseFullError(
        f"the database's disk is full ({reason}); nothing was changed by this request",
        fix="operators: free space on the database volume or grow it; then retry",
        retry_after=RETRY_AFTER_SECONDS * 12)


def first_line(error: BaseException) -> str:
    """The driver's own reason, one line and bounded, for messages and logs."""
    text = str(error).strip().splitlines()
    return text[0][:200] if text else error.__class__.__name__
