"""Log records as one JSON object per line (or human text), each carrying the id of the
request it was emitted for, with secrets scrubbed.

- `REQUEST_ID` (a contextvar) holds the current request's id; server/api/observe.py sets it
  for the lifetime of each request, so every record emitted while handling it — routes,
  services, the threadpool they run in (anyio copies the context) — gets `request_id`.
- `request_id_from(header)` keeps a sane incoming `X-Request-Id` (1–128 characters of
  `A-Za-z0-9._:-`, so a hostile header can never inject a line break, a quote or an ANSI
  escape into a log line) and otherwise makes a fresh one.
- `JsonFormatter`: ts, level, logger, msg, request_id, and for access records method, route,
  path, status, duration_ms, client; `exc` with the traceback. `TextFormatter`: one line,
  request id last.
- Both scrub bearer tokens, `mf_…` API token secrets and credential query parameters
  (token=, sig=, signature=, …) from the final text (`redact`), so a secret that lands in
  an error message, a traceback or a careless client's URL never reaches the log.
- server/commands/accesslog.py `log_config(fmt)` wires these into the logging config of
  `modelfleet serve` and `modelfleet worker`.
"""

from __future__ import annotations

import json
import logging
import random
import re
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal, get_args

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)

REQUEST_ID: ContextVar[str | None] = ContextVar("modelfleet_request_id", default=None)
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

# Fields an access record carries (server/api/observe.py passes them as `extra`).
ACCESS_FIELDS = ("method", "route", "path", "status", "duration_ms", "client")

_SECRETS = (
    (re.compile(r"(?i)(bearer\s+)[^\s\"',;]+"), r"\1[redacted]"),
    (re.compile(r"\bmf_[A-Za-z0-9_-]{6,}"), "mf_[redacted]"),
    # Query parameters that carry credentials (a client that puts them in the URL).
    (re.compile(r"(?i)\b((?:access_)?token|sig|signature|secret|password|api_key|key)="
                r"[^&\s\"']+"), r"\1=[redacted]"),
)


def request_id_from(header: bytes | str | None) -> str:
    """The incoming id when it is sane (see module), else a new random one."""
    if header is not None:
        value = header.decode("latin-1") if isinstance(header, bytes) else header
        if _SANE_REQUEST_ID.fullmatch(value):
            return value
    # 128 bits from the process's PRNG: an id to find log lines by, not a secret, so no
    # os.urandom (uuid4) per request — a syscall that drops the GIL on every poll.
    # (The module's generator is re-seeded in every forked worker.)
    return f"{random.getrandbits(128):032x}"


def redact(text: str) -> str:
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


class RequestIdFilter(logging.Filter):
    """Puts the current request's id (or None) on every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = REQUEST_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
            "request_id": getattr(record, "request_id", None) or REQUEST_ID.get(),
        }
        for name in ACCESS_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                doc[name] = value
        if record.exc_info:
            doc["exc"] = redact(self.formatException(record.exc_info))
        elif record.exc_text:
            doc["exc"] = redact(record.exc_text)
        return json.dumps(doc, ensure_ascii=True, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
        if request_id is not None:
            text = f"{text} [{request_id}]"
        return redact(text)
