"""`RequestObserver`: the outermost ASGI middleware, for every request the app routes.

It gives the request an id (a sane incoming `X-Request-Id`, else a new one:
server/observability/logs.py `request_id_from`), holds it in the `REQUEST_ID` contextvar
while the request runs (so every log record emitted meanwhile carries it), echoes it as the
response's `X-Request-Id`, counts the request by method, route template and status
(`modelfleet_http_requests_total`) and writes the access-log line (logger
`modelfleet.access`, with route, duration_ms and status as fields).

Manifest polls answered from the cache before the app's middleware (server/api/serving.py,
server/api/fastpoll.py) pass none of this: they are counted in `ManifestCache.stats`
instead, and `--log-polls` sends them through here.
"""

from __future__ import annotations

import logging
import time
from urllib.parse import quote

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.observability.logs import REQUEST_ID, request_id_from
from server.observability.metrics import HTTP_REQUESTS, UNMATCHED_ROUTE

access_log = logging.getLogger("modelfleet.access")

HEADER = b"x-request-id"
# Paths answered by raw ASGI handlers before routing (server/api/fasttelemetry.py): no
# route object is set for them, yet they are one route each.
RAW_ROUTES = frozenset({"/v1/telemetry"})
# Anything else becomes "other": a client must not mint label values (time series).
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


class RequestObserver:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_from(_header(scope, HEADER))
        echoed = (HEADER, request_id.encode())
        status = 500  # what the server error middleware answers if the app raises
        token = REQUEST_ID.set(request_id)
        start = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                # A new list: response objects (and the manifest cache) reuse theirs.
                message = {**message, "headers": [*message.get("headers", ()), echoed]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            duration_ms = round((time.perf_counter() - start) * 1000, 3)
            self._record(scope, status, duration_ms)
            REQUEST_ID.reset(token)

    @staticmethod
    def _record(scope: Scope, status: int, duration_ms: float) -> None:
        method = scope["method"] if scope["method"] in METHODS else "other"
        route = getattr(scope.get("route"), "path", None) or (
            scope["path"] if scope["path"] in RAW_ROUTES else UNMATCHED_ROUTE)
        HTTP_REQUESTS.labels(method, route, str(status)).inc()
        if not access_log.isEnabledFor(logging.INFO):
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
