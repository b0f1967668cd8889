"""`modelfleet models create|list`: the names versions are published under."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from modelfleet.commands.options import Json, Server, Token
from modelfleet.output import api

models_app = typer.Typer(no_args_is_help=True, help="Create and list models.")


@models_app.command("create")
def create(
    name: Annotated[str, typer.Argument(metavar="NAME", help="e.g. mobilenet")],
    task: Annotated[str, typer.Option(metavar="TASK", help="classification or other")]
    = "other",
    description: Annotated[str, typer.Option(metavar="TEXT")] = "",
    owner: Annotated[str, typer.Option(metavar="WHO")] = "",
    server: Server = None, token: Token = None, as_json: Json = False,
) -> None:
    """Create a model (scope publish); the same fields again are a no-op."""
    with api(server, token, as_json) as (client, out):
        doc = client.post("/v1/models", {"name": name, "task": task,
                                         "description": description, "owner": owner})
        out.result(doc, lambda c: c.print(f"model {doc['name']} ({doc['task']}), "
                                          f"{doc['version_count']} version(s)",
                                          highlight=False))


def _table(console: Console, models: list[dict[str, Any]]) -> None:
    table = Table("name", "task", "versions", "owner", "created", box=None)
    for m in models:
        table.add_row(m["name"], m["task"], str(m["version_count"]), m["owner"],
                      m["created_at"][:19].replace("T", " "))
    console.print(table)


@models_app.command("list")
def list_(
    limit: Annotated[int, typer.Option(min=1, max=500, metavar="N")] = 100,
    server: Server = None, token: Token = None, as_json: Json = False,
) -> None:
    """All models, by name."""
    with api(server, token, as_json) as (client, out):
        doc = client.get("/v1/models", limit=limit)
        out.result(doc, lambda c: _table(c, doc["models"]))
