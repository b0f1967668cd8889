"""Engine and session factory. One engine per app (no module-level globals)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from server.db.outage import DATABASE_ERRORS, classify, first_line

log = logging.getLogger("modelfleet.db")

# Seconds libpq waits for PostgreSQL to answer a new connection. Its own default is forever:
# a database host that drops packets would hang every request and /readyz instead of failing.
# A `connect_timeout` in the URL's query wins.
PG_CONNECT_TIMEOUT_S = 10


def make_engine(database_url: str, **kwargs: Any) -> Engine:
    """An engine for SQLite (the embedded default) or PostgreSQL (psycopg 3)."""
    url = database_url
    if url.startswith("postgresql://"):
        # The plain scheme would pick psycopg2, which is not installed; psycopg 3 is.
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    if url.startswith("sqlite"):
        kwargs.setdefault("connect_args", {"check_same_thread": False, "timeout": 30})
    else:
        kwargs.setdefault("pool_pre_ping", True)
        if "connect_timeout" not in make_url(url).query:
            kwargs.setdefault("connect_args", {"connect_timeout": PG_CONNECT_TIMEOUT_S})
    engine = create_engine(url, **kwargs)
    if url.startswith("sqlite"):
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # WAL lets the API read while a worker writes; foreign keys are off by default in SQLite.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def close_request_session(session: Session) -> None:
    """Close a request's session once its route is done, rolling back what it left open.

    The route's work is over by then and its response may already be on the wire, so a
    connection that died after the route's last statement (PostgreSQL restarted just then)
    is not an error to raise: the server ended that transaction with the connection, so
    nothing is left to undo. Raising would break the ASGI exchange after its response
    started. The dead connection is dropped instead (the next checkout makes a new one);
    any other error is raised as before."""
    try:
        session.close()
    except DATABASE_ERRORS as error:
        if classify(error) is None:
            raise
        # Not `classify(error).message`: that says "nothing was changed", but the route may
        # have committed before its connection died.
        log.warning("the request's database connection was lost after its last statement "
                    "(%s); dropped it", first_line(error))
        session.invalidate()


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session that commits on success and rolls back on any error."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
