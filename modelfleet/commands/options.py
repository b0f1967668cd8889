"""Options every API command takes: where the server is, the token, and `--json`."""

from __future__ import annotations

from typing import Annotated

import typer

from modelfleet.config import SERVER_ENV, TOKEN_ENV

Server = Annotated[str | None, typer.Option(
    "--server", envvar=SERVER_ENV, metavar="URL",
    help="API base URL (else the `modelfleet login` one, else http://127.0.0.1:8000)")]
Token = Annotated[str | None, typer.Option(
    "--token", envvar=TOKEN_ENV, metavar="TOKEN", show_default=False,
    help="API token (else the `modelfleet login` one)")]
Json = Annotated[bool, typer.Option(
    "--json", metavar="", help="Print exactly one JSON document on stdout")]
