"""`modelfleet keys init|rotate|show`: signing keys and signed root versions.

`init` writes the offline root keys and the online release key (files with mode 0600) and the
self-signed root v1 that apps pin; `rotate` writes root N+1 signed by a threshold of root N's
keys and of its own. Both import the new root into the server's database so the API serves it
at /v1/root/<N>.json, and write it to the blob store's v1/root/<N>.json for devices reading the
bucket (the server also imports DATA_DIR/roots at start and writes what the bucket lacks).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:  # imported lazily at run time: the CLI starts without the server stack
    from server.publish.keys import KeysResult

keys_app = typer.Typer(no_args_is_help=True, help="Signing keys and root versions.")

DataDir = Annotated[Path, typer.Option("--data-dir", help="The server's data directory")]
KeysDir = Annotated[
    Path | None,
    typer.Option("--keys-dir", envvar="MODELFLEET_KEYS_DIR",
                 help="Where key files live (default DATA_DIR/keys)"),
]
AsJson = Annotated[bool, typer.Option("--json", metavar="", help="Machine-readable output")]


def _fail(e: Exception) -> typer.Exit:
    message = getattr(e, "message", str(e))
    fix = getattr(e, "fix", None)
    typer.echo(f"error: {message}" + (f" ({fix})" if fix else ""), err=True)
    return typer.Exit(1)


def _import_into_database(data_dir: Path, keys_dir: Path | None) -> str:
    """Store the roots in the server database; a failure here is not fatal (the server imports
    them at start), so it is reported, not raised."""
    try:
        from server.db.migrate import upgrade
        from server.publish.bucket import write_roots
        from server.publish.keys import KeyPaths
        from server.publish.rootstore import sync_roots
        from server.settings import Settings
        from server.wiring import core

        settings = Settings(data_dir=data_dir)
        upgrade(settings.resolved_database_url)
        with core(settings) as c, c.session_factory() as session:
            added = sync_roots(session, KeyPaths.for_data_dir(data_dir, keys_dir))
            session.commit()
            served = write_roots(session, c.blob_store)
        return (f"stored root version(s) {added or 'none new'} in the server database, "
                f"{served or 'none new'} in the bucket")
    except Exception as e:  # reported, not raised: the server imports them at start too
        return f"warning: roots not stored in the database yet ({e}); the server imports " \
            "them at start"


def _report(result: KeysResult, note: str, as_json: bool, what: str) -> None:
    root = result.root
    doc = {
        "root_version": root.version, "root_path": str(result.root_path),
        "root_keyids": root.roles["root"].keyids, "root_threshold": root.roles["root"].threshold,
        "release_keyid": result.release_keyid,
        "new_root_key_files": [str(p) for p in result.new_root_key_paths],
        "expires": root.expires, "database": note,
    }
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    typer.echo(f"{what}: root v{root.version} at {result.root_path}")
    typer.echo(f"  root keys ({root.roles['root'].threshold} of "
               f"{len(root.roles['root'].keyids)} must sign a rotation):")
    for path in result.new_root_key_paths:
        typer.echo(f"    {path}")
    typer.echo(f"  release key: {result.release_keyid[:16]}… (online, signs manifests)")
    typer.echo(f"  {note}")
    typer.echo("  Move the root key files OFF this machine (offline storage); bring a threshold "
               "back only to rotate.")


@keys_app.command("init")
def init(
    data_dir: DataDir = Path("data"),
    keys_dir: KeysDir = None,
    root_keys: Annotated[int, typer.Option(min=1, max=16, help="Number of root keys")] = 3,
    threshold: Annotated[int, typer.Option(min=1, max=16, help="Root signatures needed")] = 2,
    as_json: AsJson = False,
) -> None:
    """Create root keys, the release key and root v1 (what apps pin). Refuses to overwrite."""
    from server.publish.errors import PublishError
    from server.publish.keys import KeyPaths, init_keys

    paths = KeyPaths.for_data_dir(data_dir, keys_dir)
    try:
        result = init_keys(paths, now=int(time.time()), root_keys=root_keys, threshold=threshold)
    except PublishError as e:
        raise _fail(e) from None
    _report(result, _import_into_database(data_dir, keys_dir), as_json, "created")


@keys_app.command("rotate")
def rotate(
    data_dir: DataDir = Path("data"),
    keys_dir: KeysDir = None,
    root_keys_dir: Annotated[
        Path | None, typer.Option(help="Where the current (offline) root keys are; "
                                  "default the keys directory")] = None,
    root_keys: Annotated[int | None, typer.Option(min=1, max=16,
                                                  help="Number of new root keys")] = None,
    threshold: Annotated[int | None, typer.Option(min=1, max=16)] = None,
    rotate_release: Annotated[bool, typer.Option(
        metavar="", help="Also replace the release key")] = False,
    as_json: AsJson = False,
) -> None:
    """Make root N+1 with new root keys, signed by a threshold of root N's keys and its own."""
    from server import crashpoints
    from server.publish.errors import PublishError
    from server.publish.keys import KeyPaths, rotate_root
    from server.settings import Settings

    crashpoints.arm(Settings(data_dir=data_dir).crash_at)  # crash tests only
    paths = KeyPaths.for_data_dir(data_dir, keys_dir)
    try:
        result = rotate_root(paths, now=int(time.time()), root_keys_dir=root_keys_dir,
                             new_root_keys=root_keys, threshold=threshold,
                             rotate_release=rotate_release)
    except PublishError as e:
        raise _fail(e) from None
    _report(result, _import_into_database(data_dir, keys_dir), as_json, "rotated")
    if rotate_release:
        note = _republish_all(data_dir)
        if not as_json:
            typer.echo(f"  {note}")


def _republish_all(data_dir: Path) -> str:
    """Re-sign every channel with the new release key: devices that moved to the new root
    refuse manifests signed by the old one."""
    try:
        from server import crashpoints
        from server.publish.publisher import publish_channel
        from server.rollouts.channels import channel_names
        from server.settings import Settings
        from server.wiring import core

        with core(Settings(data_dir=data_dir)) as c:
            names = channel_names(c.session_factory)
            serials = []
            for name in names:
                serials.append(publish_channel(c.session_factory, c.publisher, name,
                                               actor="cli", action="manifest.rekey").serial)
                crashpoints.reached("resign.rekeyed")
        return f"re-signed {len(names)} channel(s) with the new release key (serials {serials})"
    except Exception as e:  # reported: the operator can re-publish through the API
        return (f"warning: channels not re-signed ({e}); POST /v1/channels/{{channel}}/publish "
                "for each")


@keys_app.command("show")
def show(data_dir: DataDir = Path("data"), keys_dir: KeysDir = None,
         as_json: AsJson = False) -> None:
    """List the signed root versions and which keys they name."""
    from server.publish.errors import PublishError
    from server.publish.keys import KeyPaths, load_root_chain

    try:
        chain = load_root_chain(KeyPaths.for_data_dir(data_dir, keys_dir))
    except PublishError as e:
        raise _fail(e) from None
    rows: list[dict[str, Any]] = [{"version": r.version, "expires": r.expires,
             "root_keyids": r.roles["root"].keyids, "root_threshold": r.roles["root"].threshold,
             "release_keyids": r.roles["release"].keyids} for r, _ in chain]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        typer.echo(f"root v{row['version']}: {row['root_threshold']} of "
                   f"{len(row['root_keyids'])} root keys; release "
                   f"{', '.join(k[:16] for k in row['release_keyids'])}; expires {row['expires']}")


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")
