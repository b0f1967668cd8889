"""`modelfleet serve`: the API on the embedded default (owner: registry core).

SQLite file and local blob directory under --data-dir unless MODELFLEET_DATABASE_URL /
MODELFLEET_BLOB_STORE say otherwise; the schema is migrated (`alembic upgrade head`) first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def serve(
        data_dir: Annotated[Path, typer.Option("--data-dir")] = Path("data"),
        host: Annotated[str, typer.Option()] = "127.0.0.1",
        port: Annotated[int, typer.Option()] = 8000,
    ) -> None:
        """Start the API on the embedded default (SQLite file + local blob directory)."""
        import uvicorn
        from pydantic import ValidationError

        from server.app import create_app
        from server.db.migrate import upgrade
        from server.settings import Settings

        try:
            settings = Settings(data_dir=data_dir)
        except ValidationError as e:
            typer.echo(f"error: invalid settings: {e}", err=True)
            raise typer.Exit(2) from None
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        upgrade(settings.resolved_database_url)
        app = create_app(settings)
        typer.echo(f"ModelFleet API on http://{host}:{port} (data: {settings.data_dir}, "
                   f"blobs: {settings.blob_store}, docs: /docs)")
        uvicorn.run(app, host=host, port=port, log_level="info")
