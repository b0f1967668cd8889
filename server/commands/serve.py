"""`modelfleet serve`: the API on the embedded default (owner: registry core)."""

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
        typer.echo(f"ModelFleet server (not built yet) would serve {data_dir} on {host}:{port}")
