"""The access log `modelfleet serve` writes: uvicorn's, minus the "is there a newer root?"
probe. Devices ask for /v1/root/<N+1>.json on every update and a 404 is the normal answer
(no rotation happened); logged, it looks like an error on each poll."""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

ROOT_PROBE = re.compile(r"^/v1/root/\d+\.json$")


class QuietRootProbe(logging.Filter):
    """Drops uvicorn access records of `GET /v1/root/<N>.json` answered 404."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5:
            _client, method, path, _http, status = args
            if method == "GET" and status == 404 and ROOT_PROBE.fullmatch(str(path)):
                return False
        return True


def log_config() -> dict[str, Any]:
    """uvicorn's default logging config with QuietRootProbe on the access handler (applied
    in every worker process too, which build their logging from this dict)."""
    from uvicorn.config import LOGGING_CONFIG

    config: dict[str, Any] = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["quiet_root_probe"] = {
        "()": "server.commands.accesslog.QuietRootProbe"}
    config["handlers"]["access"].setdefault("filters", []).append("quiet_root_probe")
    return config
