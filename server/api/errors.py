"""The one table mapping service and storage errors to HTTP responses, and the error body
schema the OpenAPI spec documents for them.

Body: {"detail": what went wrong, "code": machine-readable kind, "field": the offending
input (when one), "fix": how to fix it (when known)}.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from server.api.limits import FIX as BODY_FIX
from server.api.limits import BodyTooLargeError
from server.blobstore import (
    BlobDigestMismatchError,
    BlobNotFoundError,
    BlobStoreError,
    BlobTooLargeError,
    InvalidBlobKeyError,
)
from server.db.models import InvalidTransitionError
from server.errors import ServiceError

log = logging.getLogger("modelfleet.api")


class ErrorBody(BaseModel):
    detail: str
    code: str
    field: str | None = None
    fix: str | None = None


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
UNAVAILABLE: dict[int | str, dict[str, Any]] = {503: _doc("Storage backend failed; retry")}

# Storage errors that reach a route: (status, code).
_BLOB_STATUS: list[tuple[type[BlobStoreError], int, str]] = [
    (BlobNotFoundError, 404, "blob_not_found"),
    (BlobTooLargeError, 413, "payload_too_large"),
    (BlobDigestMismatchError, 422, "digest_mismatch"),
    (InvalidBlobKeyError, 422, "invalid_key"),
    (BlobStoreError, 503, "storage_unavailable"),
]


def error_response(status: int, code: str, detail: str, field: str | None = None,
                   fix: str | None = None) -> JSONResponse:
    body = ErrorBody(detail=detail, code=code, field=field, fix=fix)
    return JSONResponse(status_code=status, content=body.model_dump())


async def _service_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    return error_response(exc.status_code, exc.code, exc.message, exc.field, exc.fix)


async def _transition_error(_request: Request, exc: Exception) -> JSONResponse:
    return error_response(409, "invalid_state", str(exc))


async def _blob_error(_request: Request, exc: Exception) -> JSONResponse:
    for cls, status, code in _BLOB_STATUS:
        if isinstance(exc, cls):
            if status >= 500:
                log.error("storage failure: %s", exc)
            return error_response(status, code, str(exc))
    raise exc  # unreachable: BlobStoreError is the last row


async def _body_too_large(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, BodyTooLargeError)
    return error_response(413, "payload_too_large", str(exc.detail), fix=BODY_FIX)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(BodyTooLargeError, _body_too_large)
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(InvalidTransitionError, _transition_error)
    app.add_exception_handler(BlobStoreError, _blob_error)
