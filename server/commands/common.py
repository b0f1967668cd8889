"""What several server commands share: settings for a data directory, with the schema migrated."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from server.settings import Settings


def migrated_settings(data_dir: Path) -> Settings:
    """Settings for the server at `data_dir` (environment included), with its data directory
    created and its database migrated to head; invalid settings exit 2 with the reason."""
    from pydantic import ValidationError

    from server.db.migrate import upgrade
    from server.settings import Settings

    try:
        settings = Settings(data_dir=data_dir)
    except ValidationError as e:
        typer.echo(f"error: invalid settings: {e}", err=True)
        raise typer.Exit(2) from None
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.resolved_database_url)
    return settings
