"""The one table mapping service and storage errors to HTTP responses, the error body schema
the OpenAPI spec documents for them, and the one renderer of every error body the API sends
(`error_body`): exception handlers here (HTTP errors, request validation, service, storage
and state errors, rate limits with Retry-After, and any unexpected exception as a 500) and
the request guard's refusals before a body is read (server/api/body_limits.py: 401/403, 411, 413,
422, 503) all go through it.

Body: {"detail": what went wrong, "code": machine-readable kind, "field": the offending
input (or null), "fix": how to fix it (or null), "errors": the list of problems a
request-shape validation found (or null)}.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from server.api.limits import FIX as BODY_FIX
from server.api.limits import BodyTooLargeError
from server.blobstore import (
    BlobDigestMismatchError,
    BlobNotFoundError,
    BlobStorageFullError,
    BlobStoreError,
    BlobTooLargeError,
    InvalidBlobKeyError,
)
from server.db.models import InvalidTransitionError
from server.db.outage import DATABASE_ERRORS, RETRY_AFTER_SECONDS, classify
from server.errors import ServiceError

log = logging.getLogger("modelfleet.api")


class ErrorBody(BaseModel):
    detail: str
    code: str
    field: str | None = None
    fix: str | None = None
    # Request-shape validation (FastAPI/pydantic) lists every problem here.
    errors: list[dict[str, Any]] | None = None


def _doc(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


# Spread into a route's `responses=` so the spec documents every status the route can return.
AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: _doc("Missing, unknown or revoked API token"),
    403: _doc("The token lacks the required scope"),
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: _doc("Not found")}
CONFLICT: dict[int | str, dict[str, Any]] = {409: _doc("Conflicts with existing state")}
INVALID: dict[int | str, dict[str, Any]] = {422: _doc("Invalid input: `field` names it")}
TOO_LARGE: dict[int | str, dict[str, Any]] = {413: _doc("Upload or field over its size cap")}
UNSUPPORTED: dict[int | str, dict[str, Any]] = {415: _doc("Uploaded file of the wrong type")}
UNAVAILABLE: dict[int | str, dict[str, Any]] = {
    503: _doc("Database or storage backend unavailable; retry after Retry-After seconds")}
STORAGE_FULL: dict[int | str, dict[str, Any]] = {
    507: _doc("No space left on the blob or database volume; nothing was stored")}

# Storage errors that reach a route: (status, code, fix). A 503/507 carries Retry-After.
_BLOB_STATUS: list[tuple[type[BlobStoreError], int, str, str | None]] = [
    (BlobNotFoundError, 404, "blob_not_found", None),
    (BlobTooLargeError, 413, "payload_too_large", None),
    (BlobDigestMismatchError, 422, "digest_mismatch", None),
    (InvalidBlobKeyError, 422, "invalid_key", None),
    (BlobStorageFullError, 507, "storage_full",
     "operators: free space in the blob directory or grow its volume; then retry"),
    (BlobStoreError, 503, "storage_unavailable",
     f"retry after {RETRY_AFTER_SECONDS} s; operators: check the blob store (GET /readyz)"),
]


def error_body(code: str, detail: str, *, field: str | None = None, fix: str | None = None,
               errors: list[dict[str, Any]] | None = None) -> bytes:
    """The JSON bytes of an error body (see the module docstring): every error the API
    answers is rendered here, so all have one shape."""
    body = ErrorBody(detail=detail, code=code, field=field, fix=fix, errors=errors)
    return json.dumps(jsonable_encoder(body.model_dump()), ensure_ascii=False,
                      separators=(",", ":")).encode()


def error_response(status: int, code: str, detail: str, field: str | None = None,
                   fix: str | None = None, errors: list[dict[str, Any]] | None = None,
                   headers: dict[str, str] | None = None) -> Response:
    return Response(error_body(code, detail, field=field, fix=fix, errors=errors),
                    status_code=status, media_type="application/json", headers=headers)


def _field_path(loc: tuple[Any, ...] | list[Any]) -> str:
    # ("body", "inputs", 0, "shape") -> "inputs[0].shape"; the location kind is noise.
    parts = list(loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc)
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "body"


async def _request_validation(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"field": _field_path(e.get("loc", ())), "message": e.get("msg", ""),
         "type": e.get("type", "")}
        for e in exc.errors()
    ]
    first = errors[0] if errors else {"field": "body", "message": "invalid request"}
    return error_response(
        422, "invalid_request", f"{first['field']}: {first['message']}", field=first["field"],
        fix="correct the named field; the request schema is at /docs", errors=errors,
    )


async def _http_exception(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:
        # FastAPI's "error parsing the body" (undecodable JSON / multipart): it is a malformed
        # request like any other validation failure, so answer it the same way.
        return error_response(422, "invalid_request", f"request body: {exc.detail}",
                              field="body", fix="send well-formed JSON (UTF-8) or multipart")
    return error_response(exc.status_code, f"http_{exc.status_code}", str(exc.detail),
                          headers=dict(exc.headers or {}))


def use_error_body_for_validation_errors(app: FastAPI) -> None:
    """FastAPI documents 422 as its own HTTPValidationError; this app answers every 422 with
    ErrorBody instead, so make the spec say so (one error shape for clients)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = build()
            schemas = spec.get("components", {}).get("schemas", {})
            if "HTTPValidationError" in schemas:
                schemas["HTTPValidationError"] = ErrorBody.model_json_schema()
                schemas["HTTPValidationError"]["title"] = "HTTPValidationError"
                schemas.pop("ValidationError", None)
            app.openapi_schema = spec
        return app.openapi_schema

    # FastAPI documents replacing app.openapi to customise the schema; mypy sees a method.
    app.openapi = openapi  # type: ignore[method-assign]


async def _service_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    headers = None if exc.retry_after is None else {"Retry-After": str(exc.retry_after)}
    return error_response(exc.status_code, exc.code, exc.message, exc.field, exc.fix,
                          exc.errors, headers=headers)


async def _database_error(request: Request, exc: Exception) -> Response:
    """A database that is down or full is the client's 503/507 with the reason; any other
    database error is a bug and stays a 500."""
    translated = classify(exc)
    if translated is None:
        raise exc
    log.error("database outage: %s", translated.message)
    return await _service_error(request, translated)


def internal_error_response() -> Response:
    """The body of every unexpected exception: the client learns nothing of the internals.
    server/api/observe.py sends it (with the request's X-Request-Id) when the app raises."""
    return error_response(500, "internal_error", "the server failed to answer this request",
                          fix="retry later; if it persists, report it with the X-Request-Id "
                          "of the response")


async def _internal_error(_request: Request, _exc: Exception) -> Response:
    # Starlette's ServerErrorMiddleware calls this, then re-raises the exception for the
    # server to log with its traceback. The observer inside it has usually answered already.
    return internal_error_response()


async def _transition_error(_request: Request, exc: Exception) -> Response:
    return error_response(409, "invalid_state", str(exc))


async def _blob_error(_request: Request, exc: Exception) -> Response:
    for cls, status, code, fix in _BLOB_STATUS:
        if isinstance(exc, cls):
            if status < 500:
                return error_response(status, code, str(exc), fix=fix)
            log.error("storage failure: %s", exc)
            return error_response(status, code, str(exc), fix=fix,
                                  headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    raise exc  # unreachable: BlobStoreError is the last row


async def _body_too_large(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, BodyTooLargeError)
    return error_response(413, "payload_too_large", str(exc.detail), fix=BODY_FIX)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(BodyTooLargeError, _body_too_large)
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(StarletteHTTPException, _http_exception)
    use_error_body_for_validation_errors(app)
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(InvalidTransitionError, _transition_error)
    app.add_exception_handler(BlobStoreError, _blob_error)
    for database_error in DATABASE_ERRORS:
        app.add_exception_handler(database_error, _database_error)
    app.add_exception_handler(Exception, _internal_error)
