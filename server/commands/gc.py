"""`modelfleet gc`: delete uploaded source files that no version names (an upload killed
between storing its files and committing its row), once older than the grace period
(server/services/source_gc.py). API processes run the same pass at start and every
`MODELFLEET_SOURCE_GC_INTERVAL_SECONDS`; this runs it now, e.g. from cron when that is 0.
Safe while servers run: an upload in flight is younger than the grace period.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def gc(
        data_dir: Annotated[Path | None, typer.Option("--data-dir", help="overrides "
                            "MODELFLEET_DATA_DIR")] = None,
        grace_seconds: Annotated[float | None, typer.Option(
            min=0, help="keep orphans younger than this (default: "
            "MODELFLEET_SOURCE_GC_GRACE_SECONDS); it must exceed the longest upload")] = None,
        dry_run: Annotated[bool, typer.Option(help="list what would go, delete "
                           "nothing")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="the report as JSON")] = False,
    ) -> None:
        """Delete uploaded files no version names, older than the grace period."""
        from server.db.migrate import upgrade
        from server.services.source_gc import collect_sources
        from server.settings import Settings
        from server.wiring import core

        settings = Settings() if data_dir is None else Settings(data_dir=data_dir)
        upgrade(settings.resolved_database_url)
        grace = settings.source_gc_grace_seconds if grace_seconds is None else grace_seconds
        with core(settings) as c:
            report = collect_sources(c.session_factory, c.blob_store, now=time.time(),
                                     grace_seconds=grace, dry_run=dry_run)
        if as_json:
            typer.echo(json.dumps(asdict(report) | {"dry_run": dry_run}))
        else:
            verb = "would delete" if dry_run else "deleted"
            typer.echo(f"{verb} {len(report.deleted)} orphaned source blob(s); kept "
                       f"{len(report.young)} younger than {grace:.0f} s and "
                       f"{report.referenced} a version names")
            for key in report.deleted:
                typer.echo(f"  {key}")
        if report.failed:
            typer.echo(f"error: could not read or delete {len(report.failed)} blob(s): "
                       f"{', '.join(report.failed[:10])}", err=True)
            raise typer.Exit(1)
