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
        workers: Annotated[int, typer.Option(min=1, max=64, help="API processes")] = 1,
        log_polls: Annotated[bool, typer.Option(
            "--log-polls", help="Access-log manifest polls too (slower: they then go "
            "through the full ASGI path)")] = False,
    ) -> None:
        """Start the API on the embedded default (SQLite file + local blob directory)."""
        import os

        import uvicorn

        from server.app import create_app
        from server.commands.common import migrated_settings

        settings = migrated_settings(data_dir)
        typer.echo(f"ModelFleet API on http://{host}:{port} (data: {settings.data_dir}, "
                   f"blobs: {settings.blob_store}, docs: /docs)")
        # Fresh manifest polls are answered inside the HTTP protocol, unlogged unless
        # --log-polls (server/api/fastpoll.py); everything else is uvicorn as usual.
        from server.api.fastpoll import LOG_POLLS_ENV, ManifestPollProtocol

        if log_polls:  # also read by worker processes
            os.environ[LOG_POLLS_ENV] = "1"
        if workers == 1:
            uvicorn.run(create_app(settings), host=host, port=port, http=ManifestPollProtocol,
                        loop="auto", log_level="info")
            return
        # Worker processes build the app themselves, from the environment.
        os.environ["MODELFLEET_DATA_DIR"] = str(settings.data_dir)
        uvicorn.run("server.asgi:app", host=host, port=port, workers=workers,
                    http="server.api.fastpoll:ManifestPollProtocol", loop="auto",
                    log_level="info")
