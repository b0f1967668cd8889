"""The one table mapping service and storage errors to HTTP responses, and the error body
schema the OpenAPI spec documents for them.

Body: {"detail": what went wrong, "code": machine-readable kind, "field": the offending
input (when one), "fix": how to fix it (when known)}.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
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


def error_response(status: int, code: str, detail: str, field: str | None = None,
                   fix: str | None = None,
                   errors: list[dict[str, Any]] | None = None) -> JSONResponse:
    body = ErrorBody(detail=detail, code=code, field=field, fix=fix, errors=errors)
    return JSONResponse(status_code=status, content=jsonable_encoder(body.model_dump()))


def _field_path(loc: tuple[Any, ...] | list[Any]) -> str:
    # ("body", "inputs", 0, "shape") -> "inputs[0].shape"; the location kind is noise.
    parts = list(loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc)
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "body"


async def _request_validation(_request: Request, exc: Exception) -> JSONResponse:
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


async def _http_exception(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:
        # FastAPI's "error parsing the body" (undecodable JSON / multipart): it is a malformed
        # request like any other validation failure, so answer it the same way.
        return error_response(422, "invalid_request", f"request body: {exc.detail}",
                              field="body", fix="send well-formed JSON (UTF-8) or multipart")
    response = error_response(exc.status_code, f"http_{exc.status_code}", str(exc.detail))
    for name, value in (exc.headers or {}).items():
        response.headers[name] = value
    return response


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


async def _service_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    response = error_response(exc.status_code, exc.code, exc.message, exc.field, exc.fix,
                              exc.errors)
    if exc.retry_after is not None:
        response.headers["Retry-After"] = str(exc.retry_after)
    return response


async def _database_error(request: Request, exc: Exception) -> JSONResponse:
    """A database that is down or full is the client's 503/507 with the reason; any other
    database error is a bug and stays a 500."""
    translated = classify(exc)
    if translated is None:
        raise exc
    log.error("database outage: %s", translated.message)
    return await _service_error(request, translated)


async def _transition_error(_request: Request, exc: Exception) -> JSONResponse:
    return error_response(409, "invalid_state", str(exc))


async def _blob_error(_request: Request, exc: Exception) -> JSONResponse:
    for cls, status, code, fix in _BLOB_STATUS:
        if isinstance(exc, cls):
            if status < 500:
                return error_response(status, code, str(exc), fix=fix)
            log.error("storage failure: %s", exc)
            response = error_response(status, code, str(exc), fix=fix)
            response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
            return response
    raise exc  # unreachable: BlobStoreError is the last row


async def _body_too_large(_request: Request, exc: Exception) -> JSONResponse:
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
