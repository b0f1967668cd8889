"""`modelfleet versions list|show`: a model's versions; one version with its builds and gate
reports (the same document `publish --wait` ends with)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from modelfleet.api_client import ApiClient
from modelfleet.commands.options import Json, Server, Token
from modelfleet.output import EXIT_FAILED, Out, api
from server.commands.buildreport import print_builds

versions_app = typer.Typer(no_args_is_help=True, help="List and inspect model versions.")

Model = Annotated[str, typer.Argument(metavar="MODEL", help="model name")]
Version = Annotated[str, typer.Argument(metavar="VERSION", help="e.g. 1.0.0")]


def report(client: ApiClient, model: str, version: str) -> dict[str, Any]:
    """The version with `builds` in full: artifacts and gate reports (no logs)."""
    doc: dict[str, Any] = client.get(f"/v1/models/{model}/versions/{version}")
    doc["builds"] = client.get(f"/v1/models/{model}/versions/{version}/builds", logs="false")
    return doc


def fail_if_failed(out: Out, doc: dict[str, Any]) -> None:
    """Exit 1 (after the report was printed) when the version failed to build."""
    if doc["state"] == "failed":
        out.fail(f"{doc['model']} {doc['version']} failed: "
                 f"{doc.get('error') or 'a build failed'}",
                 f"see `modelfleet versions show {doc['model']} {doc['version']}`; fix the "
                 "model or its metadata and publish a new version", EXIT_FAILED, answered=True)


@versions_app.command("list")
def list_(model: Model, server: Server = None, token: Token = None,
          as_json: Json = False) -> None:
    """Versions of MODEL, newest first, with their state."""
    with api(server, token, as_json) as (client, out):
        doc = client.get(f"/v1/models/{model}/versions")

        def render(console: Console) -> None:
            table = Table("version", "state", "platforms", "shape variants", "created",
                          box=None)
            for v in doc["versions"]:
                table.add_row(v["version"], v["state"], ", ".join(v["platforms"]),
                              ", ".join(v["variants"]), v["created_at"][:19].replace("T", " "))
            console.print(table)

        out.result(doc, render)


@versions_app.command("show")
def show(model: Model, version: Version, server: Server = None, token: Token = None,
         as_json: Json = False) -> None:
    """One version with its builds and gate reports (exit 1 if it failed)."""
    with api(server, token, as_json) as (client, out):
        doc = report(client, model, version)
        out.result(doc, lambda c: print_builds(c, doc))
        fail_if_failed(out, doc)
