"""The models and the migrations agree, on SQLite and PostgreSQL, and there is one head."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from server.db.migrate import alembic_config
from server.db.models import Base
from server.db.session import make_engine


def test_migrations_have_a_single_head() -> None:
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    assert len(script.get_heads()) == 1


def test_upgrade_head_creates_every_model_table(migrated_db_url: str) -> None:
    engine = make_engine(migrated_db_url)
    try:
        tables = set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert set(Base.metadata.tables) <= tables


def test_models_and_migrations_agree(migrated_db_url: str) -> None:
    engine = make_engine(migrated_db_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    assert diff == [], f"models differ from migrations; add a migration: {diff}"


def test_upgrade_is_idempotent(migrated_db_url: str) -> None:
    from server.db.migrate import upgrade

    upgrade(migrated_db_url)  # second run: already at head, must not fail


def test_the_agreement_check_does_notice_a_column_missing_from_migrations(
    migrated_db_url: str,
) -> None:
    from sqlalchemy import Column, Integer, MetaData

    drifted = MetaData()
    for table in Base.metadata.tables.values():
        table.to_metadata(drifted)
    drifted.tables["models"].append_column(Column("added_without_migration", Integer))
    engine = make_engine(migrated_db_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), drifted)
    finally:
        engine.dispose()
    assert [d[0] for d in diff] == ["add_column"]


def test_alembic_command_line_upgrades_the_database_named_in_the_environment(
    database_url: str,
) -> None:
    # The form docker-compose's `migrate` service runs.
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    subprocess.run(
        [sys.executable, "-m", "alembic", "-c", "migrations/alembic.ini", "upgrade", "head"],
        cwd=root, env={**os.environ, "MODELFLEET_DATABASE_URL": database_url}, check=True,
        capture_output=True, timeout=120,
    )
    engine = make_engine(database_url)
    try:
        assert set(Base.metadata.tables) <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
