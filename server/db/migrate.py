"""Run Alembic migrations from code (server start, CLI commands, test fixtures).

The migration scripts live in the `migrations` package; `migrations/alembic.ini` is there for
the `alembic` command line (`alembic -c migrations/alembic.ini upgrade head`), but code builds
its Config here so it works from any working directory and from an installed wheel.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent


def alembic_config(database_url: str) -> Config:
    cfg = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolation would choke on a '%' in a password.
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    """Bring the database at `database_url` up to `revision` (idempotent)."""
    command.upgrade(alembic_config(database_url), revision)
