"""Compile-area commands.

- `modelfleet worker`: compile jobs from the durable PostgreSQL queue (procrastinate). Run
  several, on several machines, against the same database and blob store. A worker killed
  mid-build loses nothing: its heartbeat stops and another worker retries the job.
- `modelfleet builds MODEL VERSION [--wait] [--json]`: a version's builds with their gate
  results, read from the server's database; `--wait` shows progress until ready / failed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from server.commands.common import LogFormatOption


def _snapshot(data_dir: Path | None, model: str, version: str) -> dict[str, Any]:
    from server.api.builds import build_list
    from server.errors import NotFoundError
    from server.services.builds import version_builds
    from server.settings import Settings
    from server.wiring import core

    settings = Settings() if data_dir is None else Settings(data_dir=data_dir)
    try:
        with core(settings) as c, c.session_factory() as session:
            found = version_builds(session, model, version)
            return build_list(found, logs=True).model_dump(mode="json")
    except NotFoundError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


def _warn_if_key_visible(settings: Any) -> None:
    """A compile worker never signs: a release key it can read is a deployment mistake."""
    from server.wiring import key_paths

    path = key_paths(settings).release_key_path
    if path.exists():
        typer.echo(f"warning: this compile worker can see the release key {path}; compile "
                   "workers never sign — remove the key mount (docs/security.md)", err=True)


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
        role: Annotated[str, typer.Option(help="compile: sandboxed builds only, never "
                        "touches the release key (mount none); publish: delta patches and "
                        "re-signing (needs the release key); all: both")] = "all",
        log_format: LogFormatOption = None,
        metrics_port: Annotated[int, typer.Option(min=0, max=65535, help="serve this "
                                "worker's job counters for Prometheus at "
                                ":PORT/metrics (0: off)")] = 0,
    ) -> None:
        """Run compile and delta-patch jobs (needs MODELFLEET_DATABASE_URL pointing at PostgreSQL
        and, for the publish role, the release key under MODELFLEET_KEYS_DIR)."""
        import logging.config

        from server.commands.accesslog import log_config
        from server.commands.common import chosen_log_format
        from server.settings import Settings

        settings = Settings() if data_dir is None else Settings(data_dir=data_dir)
        logging.config.dictConfig(log_config(chosen_log_format(log_format, settings)))
        if not settings.resolved_database_url.startswith("postgres"):
            typer.echo("modelfleet worker needs PostgreSQL: set MODELFLEET_DATABASE_URL="
                       "postgresql+psycopg://… (the embedded SQLite default compiles inside "
                       "`modelfleet serve` instead)", err=True)
            raise typer.Exit(2)
        from server.jobs.procrastinate_queue import run_worker
        from server.wiring import WORKER_ROLES, build_worker

        if role not in WORKER_ROLES:
            typer.echo(f"error: --role must be one of {', '.join(WORKER_ROLES)}, not {role!r}",
                       err=True)
            raise typer.Exit(2)
        if role == "compile":
            _warn_if_key_visible(settings)
        typer.echo(f"{role} worker: concurrency {concurrency}, heartbeat {heartbeat}s, "
                   f"takeover after {stalled_after}s")
        if metrics_port:
            # Job counters live in this process (server/observability/metrics.py); the API's
            # /metrics does not see them.
            from prometheus_client import start_http_server

            start_http_server(metrics_port)
        made = build_worker(settings, heartbeat_s=heartbeat, stalled_after_s=stalled_after,
                            role=role)
        try:
            run_worker(settings.resolved_database_url, made.runner, made.patch_runner,
                       concurrency=concurrency, heartbeat_s=heartbeat,
                       stalled_after_s=stalled_after)
        finally:
            made.core.close()

    @app.command()
    def builds(
        model: Annotated[str, typer.Argument(help="model name")],
        version: Annotated[str, typer.Argument(help="version, e.g. 1.0.0")],
        data_dir: Annotated[Path | None, typer.Option("--data-dir", help="overrides "
                            "MODELFLEET_DATA_DIR")] = None,
        wait: Annotated[bool, typer.Option("--wait", metavar="", help="show progress until "
                        "the version is ready or failed")] = False,
        timeout: Annotated[float, typer.Option(help="seconds --wait gives up after")] = 3600,
        as_json: Annotated[bool, typer.Option("--json", metavar="",
                                              help="machine-readable output")] = False,
    ) -> None:
        """Show a version's compile builds and gate results (exit 1 if the version failed,
        5 if --wait timed out)."""
        snap = _snapshot(data_dir, model, version)
        if wait and snap["state"] not in ("ready", "failed"):
            from rich.console import Console
            from rich.progress import Progress

            deadline = time.monotonic() + timeout
            err = Console(stderr=True)
            # Progress only on a terminal: nothing in pipes and CI logs.
            with Progress(console=err, disable=as_json or not err.is_terminal) as progress:
                task = progress.add_task(f"compiling {model} {version}",
                                         total=len(snap["builds"]))
                while snap["state"] not in ("ready", "failed"):
                    if time.monotonic() > deadline:
                        typer.echo(f"error: still {snap['state']} after {timeout:.0f}s "
                                   "(fix: wait longer with --timeout)", err=True)
                        raise typer.Exit(5)  # as every --wait (docs/cli.md)
                    time.sleep(1.0)
                    snap = _snapshot(data_dir, model, version)
                    done = sum(b["state"] in ("succeeded", "failed") for b in snap["builds"])
                    progress.update(task, completed=done)
        if as_json:
            typer.echo(json.dumps(snap, indent=2))
        else:
            from rich.console import Console

            from server.commands.buildreport import print_builds

            print_builds(Console(markup=False, highlight=False), snap)
        if snap["state"] == "failed":
            raise typer.Exit(1)
