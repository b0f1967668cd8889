"""`POST /v1/telemetry` as a raw ASGI route in front of FastAPI.

A telemetry request needs none of FastAPI's machinery (no token, no schema-bound body: the
signature covers the exact bytes), and under load that machinery — the request guard's route
matching, routing, dependency resolution, the response classes — cost more server CPU than
the ingest itself. `TelemetryRoute` answers the one path with the guard's own rules and the
same `Fleet.receive` the FastAPI route calls:

1. the body is read only while within `max_telemetry_body_bytes`: a declared length over it
   is a 413 (with `Connection: close`) before a byte is read, a stream that passes it is cut
   off with a 413; too deep a nesting is a 422 (`server.api.guard.read_json_body`);
2. `Fleet.receive` verifies the signature over those bytes before parsing, rate limits,
   parses strictly and stores (group commit on PostgreSQL); a 200 means committed;
3. service errors are answered with the app's error body and status (401 unknown / revoked /
   bad signature / stale, 422 naming the field, 429 with Retry-After).

Any other path or method, or a request under a root path, goes to the app unchanged (the
FastAPI route stays for the OpenAPI spec and for root-path deployments). Under uvicorn with
`server.api.fastingest:DeviceProtocol` most telemetry never gets here: the protocol answers it
with the same `answer` (server/api/fastingest.py); this route takes what the protocol passes on.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

from server.api.errors import ErrorBody
from server.api.guard import header, read_json_body
from server.errors import ServiceError
from server.services.fleet.ingest import RateLimitedError
from server.services.fleet.service import Fleet

PATH = "/v1/telemetry"
_JSON = (b"content-type", b"application/json")


class TelemetryRoute:
    """See the module docstring. `cap` is `Settings.max_telemetry_body_bytes`."""

    def __init__(self, app: ASGIApp, *, fleet: Fleet, cap: int) -> None:
        self.app = app
        self.fleet = fleet
        self.cap = cap

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST"
                or scope.get("root_path")):
            await self.app(scope, receive, send)
            return
        body = await read_json_body(scope, receive, send, self.cap)
        if body is None:
            return  # refused (413 / 422) or the client went away
        status, payload, extra = await answer(self.fleet, header(scope, b"x-device-id"),
                                              header(scope, b"x-device-signature"), body)
        await send({"type": "http.response.start", "status": status,
                    "headers": [_JSON, (b"content-length", b"%d" % len(payload)), *extra]})
        await send({"type": "http.response.body", "body": payload})


async def answer(fleet: Fleet, device_id: str | None, signature: str | None,
                 body: bytes) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """Status, JSON body and extra headers for a telemetry request whose body was read — the
    one answer of this route and of the protocol shortcut (server/api/fastingest.py)."""
    try:
        result = await fleet.receive(device_id, signature, body)
    except RateLimitedError as e:
        return e.status_code, _error_body(e), [(b"retry-after", str(e.retry_after).encode())]
    except ServiceError as e:
        return e.status_code, _error_body(e), []
    return 200, b'{"accepted":%d,"duplicates":%d}' % (result.accepted, result.duplicates), []


def _error_body(e: ServiceError) -> bytes:
    body = ErrorBody(detail=e.message, code=e.code, field=e.field, fix=e.fix)
    return json.dumps(body.model_dump(), ensure_ascii=False, separators=(",", ":")).encode()
