"""Alembic environment: migrates the database named by the config (server.db.migrate sets
it) or, for the `alembic` command line, by MODELFLEET_DATABASE_URL."""

from __future__ import annotations

import os

from alembic import context

from server.db.models import Base
from server.db.session import make_engine

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("MODELFLEET_DATABASE_URL")
    if not url:
        raise SystemExit(
            "no database URL: set MODELFLEET_DATABASE_URL (e.g. sqlite:///data/modelfleet.db)"
        )
    return url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True,
                      render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is not None:
        _run(connectable)
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as connection:
            _run(connection)
    finally:
        engine.dispose()


def _run(connection: object) -> None:
    # Batch mode lets later ALTERs work on SQLite (copy-and-move tables).
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=True, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
