"""Which database errors are an outage (503 / 507, server/db/outage.py) and which stay a 500:
a bug or a constraint must never be disguised as "retry later"."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest
from psycopg import errors as pg
from sqlalchemy import exc as sa

from server.db.outage import (
    DatabaseFullError,
    DatabaseUnavailableError,
    classify,
    is_transient_conflict,
)


def sqlite_error(sql: str) -> sqlite3.Error:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY)")
    conn.execute("INSERT INTO t VALUES (1)")
    try:
        conn.execute(sql)
    except sqlite3.Error as e:
        return e
    raise AssertionError(f"{sql!r} did not fail")


def wrapped(orig: Exception) -> sa.DBAPIError:
    return sa.OperationalError("SELECT 1", {}, orig)


@pytest.mark.parametrize("error", [
    psycopg.OperationalError("connection failed: Connection refused"),
    pg.AdminShutdown("terminating connection due to administrator command"),
    pg.CannotConnectNow("the database system is starting up"),
    pg.TooManyConnections("sorry, too many clients already"),
    psycopg.InterfaceError("the connection is closed"),
])
def test_postgresql_gone_is_503(error: Exception) -> None:
    assert isinstance(classify(error), DatabaseUnavailableError)
    assert isinstance(classify(wrapped(error)), DatabaseUnavailableError)


def test_postgresql_disk_full_is_507() -> None:
    assert isinstance(classify(pg.DiskFull("could not extend file")), DatabaseFullError)


@pytest.mark.parametrize("error", [
    pg.UniqueViolation("duplicate key"),
    pg.UndefinedTable("relation does not exist"),
    psycopg.ProgrammingError("the query has 2 placeholders but 1 parameters were passed"),
    pg.DeadlockDetected("deadlock detected"),
    sqlite_error("INSERT INTO t VALUES (1)"),  # constraint
    sqlite_error("SELECT * FROM missing"),  # schema not migrated
])
def test_bugs_and_constraints_are_not_an_outage(error: Exception) -> None:
    assert classify(error) is None
    assert classify(wrapped(error)) is None


def test_conflicts_worth_retrying_at_once_are_not_outages() -> None:
    assert is_transient_conflict(wrapped(pg.DeadlockDetected("deadlock detected")))
    assert is_transient_conflict(wrapped(pg.SerializationFailure("could not serialize")))
    assert not is_transient_conflict(wrapped(pg.AdminShutdown("terminating connection")))
    assert not is_transient_conflict(wrapped(psycopg.OperationalError("refused")))


def test_sqlite_locked_by_another_writer_is_503_and_worth_retrying(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (id INTEGER)")
    holder.execute("BEGIN EXCLUSIVE")
    other = sqlite3.connect(path, timeout=0)
    with pytest.raises(sqlite3.OperationalError) as caught:
        other.execute("INSERT INTO t VALUES (1)")
    holder.execute("ROLLBACK")
    assert isinstance(classify(wrapped(caught.value)), DatabaseUnavailableError)
    assert is_transient_conflict(wrapped(caught.value))
