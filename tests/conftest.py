"""Shared fixtures: databases (SQLite always, PostgreSQL when reachable) and an S3 server.

PostgreSQL: each test that asks for it gets a fresh database created on the server named by
MODELFLEET_TEST_PG (default: postgres@127.0.0.1:5432, database `test` for the admin
connection) and dropped afterwards. When the server is unreachable the PostgreSQL cases are
skipped, unless MODELFLEET_REQUIRE_POSTGRES=1 (set by CI on machines that have it).

S3: one moto server per session, over real HTTP on a free loopback port; each test gets its
own bucket.

Parallel runs (pytest-xdist, as scripts/test runs them): session fixtures exist once per
worker, each with its own databases, moto server and ports. `--dist loadfile` keeps each test
module whole on one worker, in file order: several modules share one served server per module
and build on what earlier tests in it did (tests/cli/test_release_cli.py). Modules holding a
`slow` test are handed out first (`pytest_collection_modifyitems`): a worker that draws a
minutes-long module near the end would otherwise run it alone while the other one idles.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.served import free_port

PG_ADMIN_DSN = os.environ.get(
    "MODELFLEET_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with a `slow` test first, then the rest by their number of tests, most first
    (the longest work first, so that neither xdist worker is left with a long module at the
    end); each module's tests still together and in file order (a stable sort; every xdist
    worker collects the same order, as it must). scripts/test passes
    `--no-loadscope-reorder`: else xdist re-sorts the modules by test count alone and the few
    slow ones with few tests ran last."""
    heavy = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    count = Counter(item.nodeid.split("::")[0] for item in items)

    def order(item: pytest.Item) -> tuple[bool, int]:
        module = item.nodeid.split("::")[0]
        return module not in heavy, -count[module]

    items.sort(key=order)


def _pg_reachable() -> bool:
    try:
        import psycopg
    except ImportError:
        return False
    try:
        with psycopg.connect(PG_ADMIN_DSN, connect_timeout=3):
            return True
    except psycopg.OperationalError:
        return False


_PG_OK: bool | None = None


def require_postgres() -> None:
    """Skip (or fail, when CI demands PostgreSQL) if the server is not reachable."""
    global _PG_OK
    if _PG_OK is None:
        _PG_OK = _pg_reachable()
    if not _PG_OK:
        if os.environ.get("MODELFLEET_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL required but unreachable at {PG_ADMIN_DSN}")
        pytest.skip(f"PostgreSQL unreachable at {PG_ADMIN_DSN}")


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh, empty PostgreSQL database as a SQLAlchemy URL (psycopg 3 driver), dropped
    on exit (for fixtures of any scope)."""
    require_postgres()
    import psycopg

    name = f"mf_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_DSN.rsplit("/", 1)[0]
    try:
        yield f"{base.replace('postgresql://', 'postgresql+psycopg://', 1)}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database as a SQLAlchemy URL (psycopg 3 driver)."""
    with postgres_database() as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """An empty database URL, once for SQLite and once for PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'modelfleet.db'}"
    else:
        yield request.getfixturevalue("postgres_url")


@pytest.fixture
def factory(database_url: str) -> Iterator[Any]:
    """A session factory on `database_url`, migrated to the head revision (a module that
    needs another database defines its own `factory`)."""
    from server.db.migrate import upgrade
    from server.db.session import make_engine, make_session_factory

    upgrade(database_url)
    engine = make_engine(database_url)
    try:
        yield make_session_factory(engine)
    finally:
        engine.dispose()


@dataclass(frozen=True)
class S3Bucket:
    endpoint_url: str
    bucket: str
    access_key: str = "testing"
    secret_key: str = "testing"
    region: str = "us-east-1"

    def client(self):  # type: ignore[no-untyped-def]
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
        )


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """Endpoint URL of a moto S3 server running over real HTTP for the whole session."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: str) -> S3Bucket:
    """A new, empty bucket on the session's S3 server."""
    bucket = S3Bucket(endpoint_url=s3_server, bucket=f"mf-{uuid.uuid4().hex[:12]}")
    bucket.client().create_bucket(Bucket=bucket.bucket)
    return bucket


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """Undo the logging configuration a test's command applied (`modelfleet worker` and
    `serve` run dictConfig: root at INFO to stderr). Left in place, the next test's CLI run
    under CliRunner gets those log lines mixed into the output it parses as JSON."""
    import logging

    def snapshot() -> dict[str, tuple[list[logging.Handler], int, bool, bool]]:
        loggers = {name: lg for name, lg in logging.Logger.manager.loggerDict.items()
                   if isinstance(lg, logging.Logger)}
        loggers[""] = logging.getLogger()
        return {name: (lg.handlers[:], lg.level, lg.propagate, lg.disabled)
                for name, lg in loggers.items()}

    before = snapshot()
    yield
    for name, (handlers, level, propagate, disabled) in before.items():
        lg = logging.getLogger(name or None)
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate, lg.disabled = propagate, disabled
    for name in set(snapshot()) - set(before):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.setLevel(logging.NOTSET)
        lg.propagate, lg.disabled = True, False
