"""`modelfleet serve`: the API on the embedded default (owner: registry core).

SQLite file and local blob directory under --data-dir unless MODELFLEET_DATABASE_URL /
MODELFLEET_BLOB_STORE say otherwise; the schema is migrated (`alembic upgrade head`) first.
A port already in use is reported at once, before anything else happens.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated

import typer


def port_in_use(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on (as uvicorn would bind it), or None if it can."""
    try:
        family, kind, proto, _name, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        return f"cannot resolve {host!r}: {e.strerror}"
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            sock.bind(address)
        except OSError as e:
            return e.strerror or str(e)
    return None


def register(app: typer.Typer) -> None:
    @app.command()
    def serve(
        data_dir: Annotated[Path, typer.Option("--data-dir")] = Path("data"),
        host: Annotated[str, typer.Option()] = "127.0.0.1",
        port: Annotated[int, typer.Option()] = 8000,
        workers: Annotated[int, typer.Option(min=1, max=64, help="API processes")] = 1,
        log_polls: Annotated[bool, typer.Option(
            "--log-polls", metavar="", help="Access-log manifest polls too (slower: they then go "
            "through the full ASGI path)")] = False,
    ) -> None:
        """Start the API on the embedded default (SQLite file + local blob directory)."""
        import os

        import uvicorn

        from server.app import create_app
        from server.commands.accesslog import log_config
        from server.commands.common import migrated_settings

        busy = port_in_use(host, port)
        if busy is not None:
            typer.echo(f"error: cannot listen on {host}:{port}: {busy} (fix: stop what runs "
                       f"there, or pick another port with --port {port + 1}; with "
                       f"./scripts/serve: PORT={port + 1})", err=True)
            raise typer.Exit(1)
        settings = migrated_settings(data_dir)
        typer.echo(f"ModelFleet API on http://{host}:{port} (data: {settings.data_dir}, "
                   f"blobs: {settings.blob_store}, docs: /docs)")
        # Fresh manifest polls are answered inside the HTTP protocol, unlogged unless
        # --log-polls (server/api/fastpoll.py); everything else is uvicorn as usual.
        from server.api.fastpoll import ManifestPollProtocol

        if log_polls:
            settings = settings.model_copy(update={"log_polls": True})
        if workers == 1:
            uvicorn.run(create_app(settings), host=host, port=port, http=ManifestPollProtocol,
                        loop="auto", log_level="info", log_config=log_config())
            return
        # Worker processes build the app themselves, from the environment (server/asgi.py).
        os.environ["MODELFLEET_DATA_DIR"] = str(settings.data_dir)
        if log_polls:
            os.environ["MODELFLEET_LOG_POLLS"] = "1"
        uvicorn.run("server.asgi:app", host=host, port=port, workers=workers,
                    http="server.api.fastpoll:ManifestPollProtocol", loop="auto",
                    log_level="info", log_config=log_config())
