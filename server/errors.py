"""Errors raised by server services; `server.api.errors` maps each to one HTTP status.

    ServiceError                 base; `.message` says what went wrong and how to fix it
    ├── NotFoundError            404  a named thing does not exist
    ├── ConflictError            409  it exists with different content / wrong state
    ├── InvalidInputError        422  a field is wrong (`.field` names it, `.fix` says how)
    │   └── UnsupportedFileError 415  an uploaded file is not of an accepted type
    ├── PayloadTooLargeError     413  an upload or field passed its size cap
    ├── AuthenticationError      401  no / unknown / revoked token
    ├── PermissionDeniedError    403  the token lacks the scope
    └── ServiceUnavailableError  503  a backend (database, storage) is down; retry later
Any of them may carry `retry_after` (seconds): the answer then has a Retry-After header
(429s, 503s, the 507 of a full disk: server/db/outage.py).
Other areas subclass these (e.g. `class ChannelNotFound(NotFoundError)`) and get the mapping.
"""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    status_code = 500
    code = "internal_error"

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None,
                 errors: list[dict[str, Any]] | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.fix = fix
        # Structured details for the body's `errors` list (e.g. each ONNX input's dims).
        self.errors = errors
        self.retry_after = retry_after


class RateLimitedError(ServiceError):
    """Too many requests from one caller; `retry_after` seconds until the next is taken."""

    status_code = 429
    code = "rate_limited"

    retry_after: int

    def __init__(self, message: str, *, retry_after: int, fix: str) -> None:
        super().__init__(message, fix=fix, retry_after=retry_after)


class NotFoundError(ServiceError):
    status_code = 404
    code = "not_found"


class ConflictError(ServiceError):
    status_code = 409
    code = "conflict"


class InvalidInputError(ServiceError):
    status_code = 422
    code = "invalid_input"


class UnsupportedFileError(InvalidInputError):
    status_code = 415
    code = "unsupported_file"


class PayloadTooLargeError(ServiceError):
    status_code = 413
    code = "payload_too_large"


class AuthenticationError(ServiceError):
    status_code = 401
    code = "unauthenticated"


class PermissionDeniedError(ServiceError):
    status_code = 403
    code = "forbidden"


class ServiceUnavailableError(ServiceError):
    status_code = 503
    code = "unavailable"
