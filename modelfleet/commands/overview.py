"""`modelfleet status|audit|devices|login`: what is live, who did what, which devices the
server knows, and where the CLI sends its requests."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from modelfleet import config
from modelfleet.commands.options import Json, Server, Token
from modelfleet.commands.rollout import rollout_table
from modelfleet.output import EXIT_USAGE, Out, api

Limit = Annotated[int, typer.Option(min=1, max=500, metavar="N", help="at most N rows")]


def _when(stamp: str | None) -> str:
    return (stamp or "")[:19].replace("T", " ")


def _status(console: Console, doc: dict[str, Any]) -> None:
    if not doc["channels"]:
        console.print("no channels yet (`modelfleet rollout start CHANNEL …` creates one)")
    for ch in doc["channels"]:
        console.print(Text.assemble((ch["name"], "bold"), f": manifest serial {ch['serial']}, "
                                    f"{len(ch['live'])} live rollout(s)"))
        if ch["live"]:
            console.print(rollout_table(ch["live"]))


def _audit(console: Console, doc: dict[str, Any]) -> None:
    if not doc["events"]:
        console.print("no audit events")
        return
    table = Table("id", "at (UTC)", "actor", "action", "target", box=None)
    for e in doc["events"]:
        table.add_row(str(e["id"]), _when(e["at"]), e["actor"], e["action"], e["target"])
    console.print(table)


def _devices(console: Console, doc: dict[str, Any]) -> None:
    if not doc["devices"]:
        console.print("no devices seen yet")
        return
    table = Table("device", "platform", "soc", "arch", "app", "last seen (UTC)", box=None)
    for d in doc["devices"]:
        p = d["profile"]
        table.add_row(d["id"], p.get("platform", ""), p.get("soc", ""), p.get("arch", ""),
                      p.get("app_version", ""), _when(d["last_seen_at"]))
    console.print(table)


def _read_token(out: Out) -> str:
    if sys.stdin.isatty():
        secret: str = typer.prompt("API token", hide_input=True)
        return secret.strip()
    line = sys.stdin.readline().strip()
    if not line:
        out.fail("no token given", "pass --token, set MODELFLEET_TOKEN or pipe it on stdin "
                 "(`modelfleet tokens create … | tail -n 1`)", EXIT_USAGE)
    return line


def register(app: typer.Typer) -> None:
    @app.command()
    def status(server: Server = None, token: Token = None, as_json: Json = False) -> None:
        """Channels with their manifest serial and live (not halted) rollouts."""
        with api(server, token, as_json) as (client, out):
            channels = client.get("/v1/channels")
            for ch in channels:
                rollouts = client.get(f"/v1/channels/{ch['name']}/rollouts")
                ch["live"] = [r for r in rollouts if r["state"] != "halted"]
            doc = {"server": client.server, "channels": channels}
            out.result(doc, lambda c: _status(c, doc))

    @app.command()
    def audit(
        limit: Limit = 50,
        action: Annotated[str | None, typer.Option(metavar="ACTION",
                                                   help="e.g. rollout.halt")] = None,
        target: Annotated[str | None, typer.Option(metavar="PREFIX",
                                                   help="target prefix, e.g. mobilenet/")]
        = None,
        before_id: Annotated[int | None, typer.Option(metavar="ID", min=1,
                                                      help="older than this event")] = None,
        server: Server = None, token: Token = None, as_json: Json = False,
    ) -> None:
        """Audit events, newest first (any valid token)."""
        with api(server, token, as_json) as (client, out):
            doc = client.get("/v1/audit", limit=limit, action=action, target_prefix=target,
                             before_id=before_id)
            out.result(doc, lambda c: _audit(c, doc))

    @app.command()
    def devices(limit: Limit = 100, server: Server = None, token: Token = None,
                as_json: Json = False) -> None:
        """Devices the server has seen, most recently seen first."""
        with api(server, token, as_json) as (client, out):
            doc = client.get("/v1/devices", limit=limit)
            out.result(doc, lambda c: _devices(c, doc))

    @app.command()
    def login(
        server: Annotated[str, typer.Option("--server", envvar=config.SERVER_ENV,
                                            metavar="URL", help="API base URL")]
        = config.DEFAULT_SERVER,
        token: Annotated[str | None, typer.Option(
            "--token", envvar=config.TOKEN_ENV, metavar="TOKEN",
            help="else prompted for (or read from stdin)")] = None,
        as_json: Json = False,
    ) -> None:
        """Check a token against the server and save both for later commands (mode 0600)."""
        secret = token or _read_token(Out(as_json))
        with api(server, secret, as_json) as (client, out):
            client.check_token()
            path = config.save(client.server, secret)
            doc = {"server": client.server, "token": config.mask(secret),
                   "config": str(path)}
            out.result(doc, lambda c: c.print(
                f"logged in to {doc['server']} with token {doc['token']} (saved in "
                f"{path}, readable only by you)", highlight=False, soft_wrap=True))
