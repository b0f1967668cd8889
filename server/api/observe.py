"""`RequestObserver`: the outermost ASGI middleware, for every request the app routes.

It gives the request an id (a sane incoming `X-Request-Id`, else a new one:
server/observability/logs.py `request_id_from`), holds it in the `REQUEST_ID` contextvar
while the request runs (so every log record emitted meanwhile carries it), echoes it as the
response's `X-Request-Id`, counts the request by method, route template and status
(`modelfleet_http_requests_total`) and writes the access-log line (logger
`modelfleet.access`, with route, duration_ms and status as fields).

A client that goes away before its answer (mid-body, or while the route runs) is recorded
as 499, never 500: whatever the app did after the disconnect (a body read that failed, a
refusal nobody received) is not a server error, and a client must not be able to fake 5xx
alerts. A real server error after a disconnect is still logged by the app as such.

Device traffic — manifest polls and telemetry, one line per device every few seconds at
fleet scale — is counted like any request; its answers below 400 are written to the access
log only when `log_device_requests` is on (`Settings.log_polls`, `modelfleet serve
--log-polls`). Refusals and failures (401, 413, 429, 499, 5xx, …) are always logged.
"""

from __future__ import annotations

import logging
import time
from typing import Any
from urllib.parse import quote

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.api.errors import internal_error_response
from server.observability.logs import REQUEST_ID, request_id_from
from server.observability.metrics import HTTP_REQUESTS, UNMATCHED_ROUTE

access_log = logging.getLogger("modelfleet.access")

HEADER = b"x-request-id"
# The route templates of device traffic (see the module docstring).
DEVICE_ROUTES = frozenset({"/v1/channels/{channel}/manifest", "/v1/telemetry"})
# nginx's status for "the client closed the connection before the answer".
CLIENT_CLOSED = 499
# Anything else becomes "other": a client must not mint label values (time series).
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


class RequestObserver:
    def __init__(self, app: ASGIApp, *, log_device_requests: bool = False) -> None:
        self.app = app
        self.log_device_requests = log_device_requests
        # The counter per label set, looked up once: `labels()` takes a lock per call.
        self._counters: dict[tuple[str, str, int], Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_from(_header(scope, HEADER))
        echoed = (HEADER, request_id.encode())
        status = 500  # what the server error middleware answers if the app raises
        started = False
        gone = False  # the client disconnected before the answer started
        token = REQUEST_ID.set(request_id)
        start = time.perf_counter()

        async def watch_receive() -> Message:
            nonlocal gone
            message = await receive()
            if message["type"] == "http.disconnect" and not started:
                gone = True
            return message

        async def send_with_id(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                if gone:
                    return  # an answer to nobody (the app refused a body that never came)
                started = True
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), echoed]}
            elif gone and not started:
                return
            await send(message)

        try:
            await self.app(scope, watch_receive, send_with_id)
        except ClientDisconnect:
            gone = True  # Starlette's body read saw the disconnect: nothing to answer
        except Exception:
            # Answered here, not by Starlette's outermost ServerErrorMiddleware, so the 500
            # carries the X-Request-Id its body tells the client to report. The exception
            # goes on up for the server to log; that middleware sees the answer started.
            if not started and not gone:
                await internal_error_response()(scope, watch_receive, send_with_id)
            raise
        finally:
            if gone and not started:
                status = CLIENT_CLOSED
            duration_ms = round((time.perf_counter() - start) * 1000, 3)
            self._record(scope, status, duration_ms)
            REQUEST_ID.reset(token)

    def _record(self, scope: Scope, status: int, duration_ms: float) -> None:
        method = scope["method"] if scope["method"] in METHODS else "other"
        route = getattr(scope.get("route"), "path", None) or UNMATCHED_ROUTE
        key = (method, route, status)
        counter = self._counters.get(key)
        if counter is None:  # a few dozen label sets: routes × methods × statuses
            counter = self._counters[key] = HTTP_REQUESTS.labels(method, route, str(status))
        counter.inc()
        if not access_log.isEnabledFor(logging.INFO) or (
                status < 400 and route in DEVICE_ROUTES and not self.log_device_requests):
            return
        # Quoted as uvicorn's access log does: a decoded %0A in the path stays on one line.
        path = quote(scope.get("root_path", "") + scope["path"])
        query = scope.get("query_string", b"")
        target = f"{path}?{quote(query.decode('latin-1'), safe='=&%+')}" if query else path
        client = scope.get("client")
        where = f"{client[0]}:{client[1]}" if client else "-"
        access_log.info('%s - "%s %s HTTP/%s" %d', where, method, target,
                        scope.get("http_version", "1.1"), status,
                        extra={"method": method, "route": route, "path": path,
                               "status": status, "duration_ms": duration_ms,
                               "client": where})
