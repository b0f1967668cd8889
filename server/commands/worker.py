"""`modelfleet worker`: compile jobs from the durable PostgreSQL queue (procrastinate).

Run several, on several machines, against the same database and blob store. A worker killed
mid-build loses nothing: its heartbeat stops and another worker retries the job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def worker(
        data_dir: Annotated[Path | None, typer.Option("--data-dir", help="overrides "
                            "MODELFLEET_DATA_DIR")] = None,
        concurrency: Annotated[int, typer.Option(min=1, max=64, help="builds at once in "
                               "this process (each is CPU-heavy; prefer more processes)")] = 1,
        heartbeat: Annotated[float, typer.Option(min=0.2, help="seconds between "
                             "heartbeats")] = 10.0,
        stalled_after: Annotated[float, typer.Option(min=1.0, help="seconds without a "
                                 "heartbeat after which another worker takes a job "
                                 "over")] = 30.0,
    ) -> None:
        """Run compile jobs (needs MODELFLEET_DATABASE_URL pointing at PostgreSQL)."""
        import logging

        from server.settings import Settings

        logging.basicConfig(level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        settings = Settings() if data_dir is None else Settings(data_dir=data_dir)
        if not settings.resolved_database_url.startswith("postgres"):
            typer.echo("modelfleet worker needs PostgreSQL: set MODELFLEET_DATABASE_URL="
                       "postgresql+psycopg://… (the embedded SQLite default compiles inside "
                       "`modelfleet serve` instead)", err=True)
            raise typer.Exit(2)
        from server.jobs.procrastinate_queue import run_worker

        typer.echo(f"compile worker: concurrency {concurrency}, heartbeat {heartbeat}s, "
                   f"takeover after {stalled_after}s")
        run_worker(settings, concurrency=concurrency, heartbeat_s=heartbeat,
                   stalled_after_s=stalled_after)
