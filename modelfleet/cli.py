"""The `modelfleet` command: composes the server's commands, the release engineers' API
commands and the device agent's.

Each part registers its own commands and imports its heavy dependencies inside the commands,
so a device-only install (core + client extras) can run `modelfleet device …` without the
server's dependencies; the API commands need only httpx and rich (`modelfleet[cli]`).
"""

from __future__ import annotations

import importlib.util

import typer

from modelfleet.clikit import ModelfleetGroup
from modelfleet.device_cli import device_app
from server.cli import register as register_server_commands

app = typer.Typer(
    name="modelfleet",
    help="ModelFleet: model releases and over-the-air updates.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=ModelfleetGroup,
)
register_server_commands(app)


def _register_api_commands(app: typer.Typer) -> None:
    """The HTTP API commands (docs/cli.md); absent when httpx is not installed."""
    if importlib.util.find_spec("httpx") is None:  # a device-only install
        return
    from modelfleet.commands import models, overview, publish, rollout, versions

    app.add_typer(models.models_app, name="models")
    publish.register(app)
    app.add_typer(versions.versions_app, name="versions")
    app.add_typer(rollout.rollout_app, name="rollout")
    overview.register(app)


_register_api_commands(app)
app.add_typer(device_app, name="device", help="Reference device agent (the client SDK).")


def main() -> None:
    app()
