"""The HTTP server of every API process: granian (a maintained Rust server, hyper's HTTP/1
parser) running the ASGI app of server/asgi.py, with the limits a server exposed to devices
needs. No HTTP parsing or protocol code of our own: what a hostile client can do to the
connection is the server's job, configured here.

Why granian rather than uvicorn (docs/security.md "HTTP server", each point tested against a
real server over a socket in tests/security/test_http_attacks.py):
- a header-read timeout (`header_read_timeout_seconds`): a request head not complete in
  time closes the connection; uvicorn has none, so unfinished heads held connections and
  memory for as long as the client liked;
- a request-head size limit (`max_header_bytes`): a larger head is a 431 and the connection
  closed; uvicorn's httptools protocol has no limit (a 16 MiB header was read and served);
- trailer fields of a chunked body never enter the ASGI scope's headers (uvicorn's httptools
  protocol appends them to the header list the app reads); the request guard refuses
  chunked writes anyway (server/api/body_limits.py), so this holds under any server;
- `Expect: 100-continue` and pipelined requests are hyper's, per request.

HTTP/1.1 only: TLS and HTTP/2 belong to the proxy or load balancer in front.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from granian.constants import HTTPModes, Interfaces, Loops, RuntimeModes
from granian.http import HTTP1Settings
from granian.log import LogLevels
from granian.server import MPServer

from server.settings import Settings

APP_TARGET = "server.asgi:app"  # each worker builds the app from MODELFLEET_* variables
# A worker that has not stopped this long after SIGTERM is killed: one stopped while it was
# still importing the app never sees the signal (its handler is installed after).
WORKER_KILL_SECONDS = 10


def http1_settings(settings: Settings) -> HTTP1Settings:
    return HTTP1Settings(header_read_timeout=int(settings.header_read_timeout_seconds * 1000),
                         keep_alive=True, max_buffer_size=settings.max_header_bytes)


def build_server(settings: Settings, *, host: str, port: int, workers: int,
                 log_config: dict[str, Any], working_dir: Path | None = None) -> MPServer:
    """The server for `modelfleet serve` (and the benches): `workers` processes, each running
    `server.asgi:app`, so the settings reach them through the environment. Worker processes,
    not threads: the app holds the GIL (granian's MTServer is for free-threaded builds)."""
    return MPServer(
        APP_TARGET,
        address=host,
        port=port,
        interface=Interfaces.ASGI,
        workers=workers,
        http=HTTPModes.http1,
        websockets=False,
        loop=Loops.auto,  # uvloop when installed
        # One single-threaded Rust runtime per worker instead of granian's default for ASGI
        # (multi-threaded): no hand-over between threads per request. bench/fleet on the
        # shared machine, server CPU per single-report request: 1.43 → 0.79 ms minutes
        # apart (load 5–9), 2.46 → 2.21 ms back to back (load 14–20; docs/benchmarks.md).
        runtime_mode=RuntimeModes.st,
        http1_settings=http1_settings(settings),
        log_level=LogLevels.info,
        log_dictconfig=log_config,
        log_access=False,  # the app writes its own access log (server/api/observe.py)
        working_dir=working_dir,
        workers_kill_timeout=WORKER_KILL_SECONDS,
    )
