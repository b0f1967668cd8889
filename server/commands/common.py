"""What several server commands share: settings for a data directory, with the schema
migrated, and the `--log-format` option."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer

if TYPE_CHECKING:
    from server.observability.logs import LogFormat
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


LOG_FORMAT_HELP = "text | json: one JSON object per line (default MODELFLEET_LOG_FORMAT, else text)"
LogFormatOption = Annotated[str | None, typer.Option("--log-format", help=LOG_FORMAT_HELP)]


def chosen_log_format(flag: str | None, settings: Settings) -> LogFormat:
    """The flag, else the setting; exits 2 naming the choices for anything else."""
    from server.observability.logs import LOG_FORMATS

    fmt = settings.log_format if flag is None else flag
    if fmt not in LOG_FORMATS:
        typer.echo(f"error: --log-format must be one of {', '.join(LOG_FORMATS)}, not {fmt!r}",
                   err=True)
        raise typer.Exit(2)
    return cast("LogFormat", fmt)
