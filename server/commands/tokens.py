"""`modelfleet tokens create|list|revoke`: API token administration (run on the server host;
it talks to the database directly, so it needs no token itself)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:  # imported lazily at run time: the CLI starts without the server stack
    from sqlalchemy.orm import Session, sessionmaker

    from server.settings import Settings

tokens_app = typer.Typer(no_args_is_help=True, help="Create, list and revoke API tokens.")

DataDir = Annotated[
    Path, typer.Option("--data-dir", help="Data directory of the embedded default")
]


def _open(data_dir: Path) -> tuple[Settings, sessionmaker[Session]]:
    """(settings, session factory) for the database the server at `data_dir` uses; the
    schema is migrated first so tokens can be created before the first `serve`."""
    from server.commands.common import migrated_settings
    from server.wiring import build_core

    settings = migrated_settings(data_dir)
    return settings, build_core(settings).session_factory


@tokens_app.command("create")
def create(
    scope: Annotated[list[str], typer.Option(
        "--scope", help="publish, rollout, admin or enroll (devices); repeat")],
    data_dir: DataDir = Path("data"),
    name: Annotated[str, typer.Option("--name", help="Who or what the token is for")] = "",
    as_json: Annotated[bool, typer.Option("--json", metavar="",
                                          help="Print one JSON object instead")] = False,
    device_quota: Annotated[int | None, typer.Option(
        "--device-quota", metavar="N", min=1,
        help="enroll tokens: at most N devices enrolled with it, ever")] = None,
    enroll_per_hour: Annotated[int | None, typer.Option(
        "--enroll-per-hour", metavar="N", min=1,
        help="enroll tokens: at most N enrolments with it in any hour")] = None,
    expires_in: Annotated[str | None, typer.Option(
        "--expires-in", metavar="DURATION",
        help="refused after this long: 90s, 30m, 12h, 30d or seconds")] = None,
) -> None:
    """Create a token. The secret is printed once, alone on the last line of stdout."""
    from datetime import timedelta

    from server.auth import create_token
    from server.db import audit
    from server.db.types import utcnow
    from server.errors import ServiceError

    expires_at = None if expires_in is None else utcnow() + timedelta(
        seconds=_seconds(expires_in))
    settings, factory = _open(data_dir)
    with factory() as session:
        try:
            row, secret = create_token(session, scope, name=name, pepper=settings.token_pepper,
                                       device_quota=device_quota, expires_at=expires_at,
                                       enroll_per_hour=enroll_per_hour)
        except ServiceError as e:
            typer.echo(f"error: {e.message}" + (f" ({e.fix})" if e.fix else ""), err=True)
            raise typer.Exit(2) from None
        limits = {k: v for k, v in (("device_quota", device_quota),
                                    ("enroll_per_hour", enroll_per_hour),
                                    ("expires_at", expires_at and expires_at.isoformat()))
                  if v is not None}
        audit.record(session, "cli", "token.create", f"token:{row.id}", name=name,
                     scopes=row.scopes, **limits)
        session.commit()
        if as_json:
            typer.echo(json.dumps({"id": row.id, "name": row.name, "scopes": row.scopes,
                                   **limits, "token": secret}))
            return
        typer.echo(f"created token {row.id} ({row.prefix}…) scopes: {','.join(row.scopes)}")
        typer.echo("store it now; it is not shown again:")
        typer.echo(secret)


@tokens_app.command("list")
def list_(
    data_dir: DataDir = Path("data"),
    as_json: Annotated[bool, typer.Option("--json", metavar="",
                                          help="Machine-readable output")] = False,
) -> None:
    """List tokens (never their secrets)."""
    from server.auth import list_tokens

    _settings, factory = _open(data_dir)
    with factory() as session:
        rows = list_tokens(session)
        items: list[dict[str, Any]] = [
            {"id": r.id, "name": r.name, "prefix": r.prefix, "scopes": r.scopes,
             "revoked": r.revoked, "created_at": r.created_at.isoformat(),
             "last_used_at": r.last_used_at.isoformat() if r.last_used_at else None}
            for r in rows
        ]
    if as_json:
        typer.echo(json.dumps(items, indent=2))
        return
    for i in items:
        state = "revoked" if i["revoked"] else "active"
        typer.echo(f"{i['id']:>4}  {i['prefix']}…  {','.join(i['scopes']):<24} {state:<8} "
                   f"{i['name']}")


@tokens_app.command("revoke")
def revoke(
    token_id: Annotated[int, typer.Argument(help="Token id from `modelfleet tokens list`")],
    data_dir: DataDir = Path("data"),
) -> None:
    """Revoke a token; requests with it get 401 from now on."""
    from server.auth import revoke_token
    from server.db import audit
    from server.errors import ServiceError

    _settings, factory = _open(data_dir)
    with factory() as session:
        try:
            row = revoke_token(session, token_id)
        except ServiceError as e:
            typer.echo(f"error: {e.message}" + (f" ({e.fix})" if e.fix else ""), err=True)
            raise typer.Exit(1) from None
        audit.record(session, "cli", "token.revoke", f"token:{row.id}")
        session.commit()
    typer.echo(f"revoked token {token_id}")


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def _seconds(text: str) -> int:
    """`90s`, `30m`, `12h`, `30d` or plain seconds; exits 2 on anything else."""
    value = text.strip().lower()
    unit = _UNITS.get(value[-1:], 0)
    number = value[:-1] if unit else value
    if not number.isdigit() or int(number) == 0:
        typer.echo(f"error: --expires-in {text!r} is not a duration (e.g. 30d, 12h, 3600)",
                   err=True)
        raise typer.Exit(2)
    return int(number) * (unit or 1)


def register(app: typer.Typer) -> None:
    app.add_typer(tokens_app, name="tokens")
