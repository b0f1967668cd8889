"""`modelfleet bucket sync|nginx`: the blob store as the devices' read API.

`sync` writes every read path the bucket lacks or holds stale: each signed root, each
channel's current manifest, and a copy at `v1/artifacts/<sha256>` / `v1/patches/<sha256>` of
every artifact and patch stored under an older key, the row then pointed at the copy (the
backfill after upgrading; the old blobs are left in place). Idempotent; safe while the server
runs.

`nginx` prints an nginx configuration for devices: `--blob-dir` serves a local blob directory,
`--upstream` caches an S3 bucket (server/publish/nginxconf.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

bucket_app = typer.Typer(no_args_is_help=True,
                         help="The blob store as the devices' read API (v1/ paths).")

DataDir = Annotated[Path, typer.Option("--data-dir", help="The server's data directory")]


@bucket_app.command("sync")
def sync(data_dir: DataDir = Path("data")) -> None:
    """Write the roots, current manifests, artifacts and patches devices read to their v1/
    paths in the blob store (the backfill for data stored before that layout)."""
    from server.db.migrate import upgrade
    from server.publish.bucket import sync_served
    from server.settings import Settings
    from server.wiring import core

    settings = Settings(data_dir=data_dir)
    upgrade(settings.resolved_database_url)
    with core(settings) as c:
        report = sync_served(c.session_factory, c.blob_store, c.publisher.current, blobs=True)
    typer.echo(f"roots written: {report.roots or 'none'}; manifests rewritten: "
               f"{report.channels or 'none'}; artifacts copied: {report.artifacts}; "
               f"patches copied: {report.patches}")


@bucket_app.command("nginx")
def nginx(
    listen: Annotated[str, typer.Option(help="nginx `listen` value, e.g. 8080")] = "8080",
    blob_dir: Annotated[Path | None, typer.Option(
        help="Serve this local blob directory (MODELFLEET_BLOB_DIR) as it is")] = None,
    upstream: Annotated[str | None, typer.Option(
        help="Cache this bucket URL (endpoint/bucket[/prefix]) for devices")] = None,
    cache_dir: Annotated[Path, typer.Option(
        help="proxy_cache_path for --upstream")] = Path("/var/cache/nginx/devices"),
) -> None:
    """Print a `server { }` block (and cache zone) for nginx's http context."""
    from server.publish import nginxconf

    if (blob_dir is None) == (upstream is None):
        typer.echo("error: give exactly one of --blob-dir and --upstream", err=True)
        raise typer.Exit(2)
    if blob_dir is not None:
        typer.echo(nginxconf.directory_server(blob_dir.resolve() / "objects", listen), nl=False)
    else:
        assert upstream is not None
        try:
            typer.echo(nginxconf.caching_proxy(upstream, listen, cache_dir), nl=False)
        except ValueError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None


def register(app: typer.Typer) -> None:
    app.add_typer(bucket_app, name="bucket")
