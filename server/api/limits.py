"""The upload size-cap error: raised by `server.api.body_limits.RequestGuard` while an upload
streams in (before the multipart parser spools it to disk), answered as a 413."""

from __future__ import annotations

from starlette.exceptions import HTTPException

FIX = "upload a smaller file or raise MODELFLEET_MAX_MODEL_BYTES on the server"


class BodyTooLargeError(HTTPException):
    """An HTTPException so FastAPI's form parser re-raises it instead of turning it into a 400."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"request body is larger than the limit of {max_bytes} bytes")
        self.max_bytes = max_bytes
