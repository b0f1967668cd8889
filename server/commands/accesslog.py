"""The logging of `modelfleet serve` and `modelfleet worker`: text or JSON lines
(server/observability/logs.py) with request ids, and the access log minus the "is there a
newer root?" probe. Devices ask for /v1/root/<N+1>.json on every update and a 404 is the
normal answer (no rotation happened); logged, it looks like an error on each poll.

The access log is the app's own (logger `modelfleet.access`, written by
server/api/observe.py: route template, duration, request id); the HTTP server's (granian,
server/http_server.py) is switched off. Manifest polls and telemetry write none unless
`--log-polls`."""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

from server.observability.logs import LogFormat

ROOT_PROBE = re.compile(r"^/v1/root/\d+\.json$")


class QuietRootProbe(logging.Filter):
    """Drops access records of `GET /v1/root/<N>.json` answered 404 (their args, as
    server/api/observe.py writes them: client, method, path, http version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5:
            _client, method, path, _http, status = args
            if method == "GET" and status == 404 and ROOT_PROBE.fullmatch(str(path)):
                return False
        return True


class StdStreamHandler(logging.Handler):
    """Writes each record to whatever `sys.stderr` / `sys.stdout` is when it emits, not to
    the stream object current when logging was configured: a command run twice in one
    process (tests, embedding) would otherwise keep writing to a closed stream."""

    def __init__(self, which: str = "stderr") -> None:
        if which not in ("stderr", "stdout"):
            raise ValueError(f"which must be stderr or stdout, not {which!r}")
        self._which = which
        super().__init__()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = getattr(sys, self._which)
            stream.write(self.format(record) + "\n")
            stream.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)


def log_config(fmt: LogFormat = "text", *, level: str = "INFO") -> dict[str, Any]:
    """dictConfig for a server process (granian applies it in every worker process too):
    everything to stderr in `fmt`, the access log to stdout without root-probe 404s."""
    formatter = "json" if fmt == "json" else "text"
    filters = ["request_id"]
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "json": {"()": "server.observability.logs.JsonFormatter"},
            "text": {"()": "server.observability.logs.TextFormatter"},
        },
        "filters": {
            "request_id": {"()": "server.observability.logs.RequestIdFilter"},
            "quiet_root_probe": {"()": "server.commands.accesslog.QuietRootProbe"},
        },
        "handlers": {
            "default": {"()": "server.commands.accesslog.StdStreamHandler", "which": "stderr",
                        "formatter": formatter, "filters": filters},
            "access": {"()": "server.commands.accesslog.StdStreamHandler", "which": "stdout",
                       "formatter": formatter, "filters": [*filters, "quiet_root_probe"]},
        },
        "loggers": {
            # granian's own records (startup, workers, errors); its access log stays off.
            "_granian": {"handlers": ["default"], "level": level, "propagate": False},
            "granian.access": {"handlers": [], "level": "WARNING", "propagate": False},
            "modelfleet.access": {"handlers": ["access"], "level": level, "propagate": False},
        },
        "root": {"handlers": ["default"], "level": level},
    }
