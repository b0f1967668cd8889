"""The `modelfleet` command: composes the server's commands and the device agent's.

Each part registers its own commands and imports its heavy dependencies inside the commands,
so a device-only install (core + client extras) can run `modelfleet device …` without the
server's dependencies.
"""

from __future__ import annotations

import typer

from modelfleet.device_cli import device_app
from server.cli import register as register_server_commands

app = typer.Typer(
    name="modelfleet",
    help="ModelFleet: model releases and over-the-air updates.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
register_server_commands(app)
app.add_typer(device_app, name="device", help="Reference device agent (the client SDK).")


def main() -> None:
    app()
