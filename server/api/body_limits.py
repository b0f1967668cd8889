"""`RequestGuard`: the ASGI middleware that decides about a write request before its body is
read.

FastAPI reads (and, for multipart, spools to disk) the whole body before any dependency runs,
so the token check in `server.api.deps` comes too late to protect memory and disk. For every
POST/PUT/PATCH/DELETE the guard, in this order and before a byte of the body is received:

0. refuses a chunked body (`Transfer-Encoding`) with 411 Length Required: only a chunked
   body can carry trailer fields, and some servers (uvicorn's httptools protocol) append
   trailers to the very header list the app reads, so `Authorization` or `X-Device-*` sent
   as a trailer would authenticate the request. Refused here, no trailer reaches
   authentication whatever server runs the app; every client of this API (the CLI, the
   device SDK, the dashboard, browsers' form uploads) sends a Content-Length;
1. finds the route and, when the route needs a token, authenticates the `Authorization`
   header and checks the route's scope with the same machinery (`server.auth`) — a failure is
   a 401/403 sent at once, with `Connection: close`, so the body is never read; the
   principal is handed to the route's token dependency in the ASGI scope, so the token is
   looked up once per request;
2. multipart uploads (routes with `File`/`Form` fields): takes one of
   `max_concurrent_uploads` slots (503 + `Retry-After` when none is free) and streams the body
   into the route under the whole-upload cap (413 once the cap is passed);
3. every other body (JSON): at most `max_json_body_bytes` (413) — or the route's own cap,
   named by its `openapi_extra` "x-max-body-setting" (device telemetry: 256 KiB) — read into
   memory, checked for nesting depth (422, see `server.json_depth`) and then handed to the
   route.

Installed by one line in the app factory, `install_request_guard(app, settings, ROUTERS)`,
which also documents the guard's answers (413, and 422 or 503) on every operation with a
request body in the OpenAPI spec, with its cap as `x-max-body-bytes`. The guard matches a
request against those routers' routes (their paths carry the router prefixes).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, params
from fastapi.routing import APIRoute, APIRouter
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server import auth
from server.api.deps import PRINCIPAL_KEY, TOKEN_SCOPES
from server.api.errors import error_body
from server.api.limits import FIX as UPLOAD_FIX
from server.api.limits import BodyTooLargeError
from server.db.outage import DATABASE_ERRORS, classify
from server.errors import ServiceError
from server.json_depth import depth_error, too_deep
from server.settings import MiB, Settings

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
UPLOAD_RETRY_AFTER_SECONDS = 5
# Room for the multipart framing and part headers around the capped files.
MULTIPART_OVERHEAD_BYTES = MiB


@dataclass(frozen=True)
class RouteRule:
    """What a write route needs before its body may be read."""

    route: APIRoute
    token: bool  # any valid token at least
    scope: str | None  # and this scope (None: any scope)
    upload: bool  # multipart with files: streamed, capped, counted
    # The Settings field holding this route's own JSON body cap (`openapi_extra`
    # "x-max-body-setting"); None: max_json_body_bytes.
    cap_setting: str | None = None


def route_rule(route: APIRoute) -> RouteRule:
    """Reads the route's dependency tree: token dependencies (`deps.TOKEN_SCOPES`) and
    `File`/`Form` body fields."""
    token, scope, upload = False, None, False
    stack = [route.dependant]
    while stack:
        dependant = stack.pop()
        if dependant.call is not None and dependant.call in TOKEN_SCOPES:
            token = True
            scope = TOKEN_SCOPES[dependant.call] or scope
        upload = upload or any(isinstance(p.field_info, params.Form)
                               for p in dependant.body_params)
        stack.extend(dependant.dependencies)
    extra = route.openapi_extra or {}
    cap_setting = extra.get("x-max-body-setting")
    return RouteRule(route, token, scope, upload,
                     cap_setting if isinstance(cap_setting, str) else None)


def json_cap(settings: Settings, rule: RouteRule | None) -> int:
    """The route's JSON body cap: its own setting when it names one."""
    if rule is not None and rule.cap_setting is not None:
        cap: int = getattr(settings, rule.cap_setting)
        return cap
    return settings.max_json_body_bytes


def _api_routes(routers: Sequence[APIRouter]) -> Iterator[APIRoute]:
    for router in routers:
        for route in router.routes:
            if isinstance(route, APIRoute):
                yield route


def _exact_rules(rules: list[RouteRule]) -> dict[tuple[str, str], RouteRule]:
    """(method, path) → rule for the routes without path parameters that no earlier route
    would match first: a dict lookup instead of trying every route in order (the rest are
    matched in order, as the router does)."""
    exact: dict[tuple[str, str], RouteRule] = {}
    for i, rule in enumerate(rules):
        path = rule.route.path
        if "{" in path:
            continue
        if any(earlier.route.path_regex.match(path) for earlier in rules[:i]
               if set(earlier.route.methods or ()) & set(rule.route.methods or ())):
            continue
        for method in rule.route.methods or ():
            exact.setdefault((method, path), rule)
    return exact


def upload_cap(settings: Settings) -> int:
    """The whole multipart request: the model (an ONNX model's external-data file counts
    within the model cap), both optional .npz files and the metadata."""
    return (settings.max_model_bytes + 2 * settings.max_npz_bytes
            + settings.max_metadata_bytes + MULTIPART_OVERHEAD_BYTES)


async def _respond(send: Send, status: int, payload: bytes,
                   extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """An error sent before the body was read: `Connection: close` stops the server from
    reading (or draining) the rest of it."""
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"), *(extra or [])],
    })
    await send({"type": "http.response.body", "body": payload})


def declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The Content-Length of raw ASGI headers, or None."""
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def header(scope: Scope, wanted: bytes) -> str | None:
    for name, value in scope.get("headers") or []:
        if name == wanted:
            return bytes(value).decode("latin-1")
    return None


class RequestGuard:
    """See the module docstring. One instance per app; the upload counter is per process."""

    def __init__(self, app: ASGIApp, *, settings: Settings, routers: Sequence[APIRouter]) -> None:
        self.app = app
        self.routers = list(routers)
        self.settings = settings
        self.upload_cap = upload_cap(settings)
        self.max_uploads = settings.max_concurrent_uploads
        self.pepper = settings.token_pepper
        self.uploads_in_flight = 0
        self._rules: list[RouteRule] | None = None
        self._exact: dict[tuple[str, str], RouteRule] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in WRITE_METHODS:
            await self.app(scope, receive, send)
            return
        rule = self._rule_for(scope)
        if rule is not None:
            scope["route"] = rule.route  # the request's route label, refused or not
        if header(scope, b"transfer-encoding") is not None:
            await _respond(send, 411, error_body(
                "length_required", "a chunked request body is refused: send the body with a "
                "Content-Length", fix="send Content-Length (a chunked body may carry "
                "trailer fields, which are never read as request headers here)"))
            return
        if rule is not None and rule.token:
            refusal = await anyio.to_thread.run_sync(self._authorize, scope, rule)
            if refusal is not None:
                await _respond(send, *refusal)
                return
        if rule is not None and rule.upload:
            await self._upload(scope, receive, send)
        else:
            await self._json(scope, receive, send, json_cap(self.settings, rule))

    # ------------------------------------------------------------------ routing and auth

    def _rule_for(self, scope: Scope) -> RouteRule | None:
        if self._rules is None:  # the routes are complete once the first request arrives
            self._rules = [route_rule(r) for r in _api_routes(self.routers)]
            self._exact = _exact_rules(self._rules)
        exact = self._exact.get((scope["method"], scope["path"]))
        if exact is not None:
            return exact
        for rule in self._rules:
            match, _ = rule.route.matches(scope)
            if match is Match.FULL:
                return rule
        return None

    def _authorize(self, scope: Scope, rule: RouteRule
                   ) -> tuple[int, bytes, list[tuple[bytes, bytes]]] | None:
        """(status, body, headers) of the refusal, or None when the token may call the route;
        then the principal is in the scope (`deps.PRINCIPAL_KEY`) for the route's token
        dependency, which takes it instead of looking the token up again. A database that is
        down is a 503 with Retry-After here too (this middleware runs outside the app's error
        handlers, where it would be a bare 500)."""
        factory = scope["app"].state.session_factory
        try:
            try:
                with factory() as session:
                    principal = auth.authenticate(session, header(scope, b"authorization"),
                                                  pepper=self.pepper)
                    if rule.scope is not None:
                        auth.require(principal, rule.scope)
                    session.commit()  # persists last_used_at
            except DATABASE_ERRORS as db_error:
                outage = classify(db_error)
                if outage is None:
                    raise
                raise outage from db_error
        except ServiceError as e:
            extra = [] if e.retry_after is None else [
                (b"retry-after", str(e.retry_after).encode())]
            return e.status_code, error_body(e.code, e.message, field=e.field, fix=e.fix), extra
        scope[PRINCIPAL_KEY] = principal
        return None

    # ------------------------------------------------------------------ bodies

    async def _json(self, scope: Scope, receive: Receive, send: Send, cap: int) -> None:
        body = await read_json_body(scope, receive, send, cap)
        if body is not None:
            await self.app(scope, _replay(body, receive), send)

    async def _upload(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = declared_length(scope.get("headers") or [])
        if declared is not None and declared > self.upload_cap:
            await self._too_large(send, self.upload_cap, fix=UPLOAD_FIX)
            return
        if self.uploads_in_flight >= self.max_uploads:
            await _respond(send, 503, error_body(
                "too_many_uploads",
                f"{self.max_uploads} uploads are already in progress on this server",
                fix=f"retry in {UPLOAD_RETRY_AFTER_SECONDS} s (MODELFLEET_MAX_CONCURRENT_UPLOADS "
                "raises the limit)"),
                [(b"retry-after", str(UPLOAD_RETRY_AFTER_SECONDS).encode())])
            return
        self.uploads_in_flight += 1
        try:
            await self._capped(scope, receive, send)
        finally:
            self.uploads_in_flight -= 1

    async def _capped(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Streams the body into the route, cut off at the upload cap (before the multipart
        parser spools the excess to disk)."""
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.upload_cap:
                    raise BodyTooLargeError(self.upload_cap)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLargeError:
            if not started:
                await self._too_large(send, self.upload_cap, fix=UPLOAD_FIX)

    async def _too_large(self, send: Send, cap: int, *,
                         fix: str = "send a smaller request body") -> None:
        await too_large(send, cap, fix=fix)


def too_large_payload(cap: int, *, fix: str = "send a smaller request body") -> bytes:
    """The 413 body for a request body over `cap`."""
    return error_body("payload_too_large",
                      f"request body is larger than the limit of {cap} bytes", fix=fix)


def too_deep_payload() -> bytes:
    """The 422 body for JSON nested deeper than allowed."""
    return error_body("invalid_request", f"request body: {depth_error()}", field="body",
                      fix="send the documented request schema (see /docs)")


async def too_large(send: Send, cap: int, *, fix: str = "send a smaller request body") -> None:
    await _respond(send, 413, too_large_payload(cap, fix=fix))


async def read_json_body(scope: Scope, receive: Receive, send: Send, cap: int) -> bytes | None:
    """The whole JSON body, read only while it stays within `cap` (413 at once when the
    declared length is over it, before a byte is read), and no deeper than JSON nesting
    allows (422); None when a refusal was sent or the client went away."""
    declared = declared_length(scope.get("headers") or [])
    if declared is not None and declared > cap:
        await too_large(send, cap)
        return None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None  # the client went away
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            await too_large(send, cap)
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    if too_deep(body):
        await _respond(send, 422, too_deep_payload())
        return None
    return body


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands the route the body already read, then defers to the server
    (for `http.disconnect`)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def install_request_guard(app: FastAPI, settings: Settings,
                          routers: Sequence[APIRouter]) -> None:
    """Adds the guard to `app` and documents what it answers in the app's OpenAPI spec."""
    app.add_middleware(RequestGuard, settings=settings, routers=routers)
    build = app.openapi
    rules = [route_rule(r) for r in _api_routes(routers)]
    uploads = upload_cap(settings)

    def openapi() -> dict[str, Any]:
        spec = build()
        for rule in rules:
            for method in sorted((rule.route.methods or set()) & WRITE_METHODS):
                operation = spec.get("paths", {}).get(rule.route.path_format, {}).get(
                    method.lower())
                if operation is None or "requestBody" not in operation:
                    continue
                responses = operation.setdefault("responses", {})
                responses.setdefault("413", _doc("Request body over its cap (x-max-body-bytes)"))
                if rule.upload:
                    responses.setdefault("503", _doc("Too many uploads at once; see Retry-After"))
                else:
                    responses.setdefault("422", _doc("Invalid input: `field` names it"))
                operation.pop("x-max-body-setting", None)
                operation["x-max-body-bytes"] = (uploads if rule.upload
                                                 else json_cap(settings, rule))
        return spec

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override hook


def _doc(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
