"""`modelfleet serve`: the API on the embedded default (owner: registry core).

SQLite file and local blob directory under --data-dir unless MODELFLEET_DATABASE_URL /
MODELFLEET_BLOB_STORE say otherwise; the schema is migrated (`alembic upgrade head`) first.
A port already in use is reported at once, before anything else happens. The HTTP server is
granian with the limits of server/http_server.py; `--workers N` runs N API processes sharing
one fresh Prometheus multiprocess directory; `--log-format json` writes one JSON object per
log line (server/observability/logs.py).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from server.commands.common import LogFormatOption


def port_in_use(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on (as the server would bind it), or None if it can."""
    try:
        family, kind, proto, _name, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        return f"cannot resolve {host!r}: {e.strerror}"
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does
        try:
            sock.bind(address)
        except OSError as e:
            return e.strerror or str(e)
    return None


@contextlib.contextmanager
def multiprocess_metrics_dir() -> Iterator[Path]:
    """A fresh PROMETHEUS_MULTIPROC_DIR (under the temp directory, TMPDIR) for this run's
    worker processes: forked after this, they inherit it and write their counters there;
    GET /metrics in any of them sums all (server/observability/metrics.py). Fresh, because
    counters left by an earlier run would be summed in; removed afterwards."""
    import os
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="modelfleet-metrics-"))
    # prometheus_client's own variable, read once when it is imported: set before anything
    # here imports it (server.observability.metrics would), so forked workers see it.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def register(app: typer.Typer) -> None:
    @app.command()
    def serve(
        data_dir: Annotated[Path, typer.Option("--data-dir")] = Path("data"),
        host: Annotated[str, typer.Option()] = "127.0.0.1",
        port: Annotated[int, typer.Option()] = 8000,
        workers: Annotated[int, typer.Option(min=1, max=64, help="API processes")] = 1,
        log_polls: Annotated[bool, typer.Option(
            "--log-polls", metavar="", help="Access-log manifest polls and telemetry too "
            "(one line per device request)")] = False,
        log_format: LogFormatOption = None,
    ) -> None:
        """Start the API on the embedded default (SQLite file + local blob directory)."""
        import os

        from server.commands.accesslog import log_config
        from server.commands.common import chosen_log_format, migrated_settings
        from server.http_server import build_server

        busy = port_in_use(host, port)
        if busy is not None:
            typer.echo(f"error: cannot listen on {host}:{port}: {busy} (fix: stop what runs "
                       f"there, or pick another port with --port {port + 1}; with "
                       f"./scripts/serve: PORT={port + 1})", err=True)
            raise typer.Exit(1)
        with contextlib.ExitStack() as stack:
            if workers > 1:  # before anything imports prometheus_client: workers are forked
                stack.enter_context(multiprocess_metrics_dir())
            settings = migrated_settings(data_dir)
            fmt = chosen_log_format(log_format, settings)
            settings = settings.model_copy(update={"log_format": fmt})
            typer.echo(f"ModelFleet API on http://{host}:{port} (data: {settings.data_dir}, "
                       f"blobs: {settings.blob_store}, docs: /docs)")
            # Worker processes build the app themselves, from the environment
            # (server/asgi.py).
            os.environ["MODELFLEET_DATA_DIR"] = str(settings.data_dir)
            os.environ["MODELFLEET_LOG_FORMAT"] = fmt
            if log_polls:
                os.environ["MODELFLEET_LOG_POLLS"] = "1"
            build_server(settings, host=host, port=port, workers=workers,
                         log_config=log_config(fmt)).serve()
