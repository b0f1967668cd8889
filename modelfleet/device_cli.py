"""`modelfleet device …`: the reference device agent built on client_sdk (issue 6)."""

from __future__ import annotations

import typer

device_app = typer.Typer(no_args_is_help=True)


@device_app.command("version")
def version() -> None:
    """Print the client SDK version."""
    import client_sdk

    typer.echo(client_sdk.__version__)
