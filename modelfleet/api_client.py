"""The release engineers' HTTP client of the ModelFleet API: one httpx seam, typed errors.

Every error the server answers carries {detail, code, field, fix} (docs/api.md); `ApiClient`
turns a 4xx into `RefusedError` and a 5xx, an unreadable answer or a network failure into
`ServerError`, both with that body's parts, so commands print one line with the fix and exit
with a code that says which side failed (docs/cli.md).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

USER_AGENT = "modelfleet-cli"
TIMEOUT_SECONDS = 30.0
# An upload streams the whole file before the server answers; allow slow links.
UPLOAD_TIMEOUT_SECONDS = 3600.0


@dataclass
class ApiError(Exception):
    """A request that did not succeed; `message` and `fix` come from the server when it said."""

    message: str
    fix: str | None = None
    code: str = ""
    field: str | None = None
    status: int | None = None

    def __str__(self) -> str:
        return self.message

    def document(self) -> dict[str, Any]:
        """The error as the one JSON document `--json` prints."""
        return {"error": {"detail": self.message, "code": self.code, "field": self.field,
                          "fix": self.fix, "status": self.status}}


class RefusedError(ApiError):
    """The server refused the request (4xx): wrong input, state, token or scope."""


class ServerError(ApiError):
    """The server failed (5xx) or could not be reached / understood."""


class _CountingFile(io.FileIO):
    """A file whose reads report how many bytes went out (the upload progress bar)."""

    def __init__(self, path: Path, on_read: Callable[[int], None]) -> None:
        super().__init__(path, "rb")
        self._on_read = on_read

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        if data:
            self._on_read(len(data))
        return data


class ApiClient:
    """Talks to one ModelFleet server with one (optional) bearer token."""

    def __init__(self, server: str, token: str | None = None, *,
                 transport: httpx.BaseTransport | None = None,
                 timeout: float = TIMEOUT_SECONDS) -> None:
        self.server = server.rstrip("/")
        headers = {"User-Agent": USER_AGENT}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout,
                                  transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # The one seam: every request goes through here.
    def request(self, method: str, path: str, *, json_body: Any = None,
                params: Mapping[str, Any] | None = None, files: Any = None,
                data: Mapping[str, str] | None = None,
                timeout: float | None = None) -> Any:
        try:
            response = self._http.request(
                method, path, json=json_body, params=params, files=files, data=data,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT)
        except httpx.TimeoutException:
            raise ServerError(f"{method} {self.server}{path}: no answer in time",
                              fix="check the server is up and reachable; retry") from None
        except httpx.HTTPError as e:
            raise ServerError(f"cannot reach {self.server}: {e}",
                              fix="start it (`modelfleet serve`) or pass the right --server "
                              "/ MODELFLEET_SERVER") from None
        return _decode(method, path, response)

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items()
                                                 if v is not None})

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, json_body=body)

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, json_body=body)

    def upload_version(self, model: str, files: Mapping[str, Path], metadata: dict[str, Any],
                       on_progress: Callable[[int], None] | None = None) -> Any:
        """POST a version: `files` maps form part (model, model_data, reference,
        calibration) to a path; `on_progress(n)` is told of every n bytes sent."""
        report = on_progress or (lambda _n: None)
        opened = {part: _CountingFile(path, report) for part, path in files.items()}
        try:
            parts = {part: (files[part].name, f, "application/octet-stream")
                     for part, f in opened.items()}
            try:
                return self.request("POST", f"/v1/models/{model}/versions", files=parts,
                                    data={"metadata": json.dumps(metadata)},
                                    timeout=UPLOAD_TIMEOUT_SECONDS)
            except ServerError:
                # A server may refuse (401/403) before reading the body and close the
                # connection mid-upload; say why instead of "connection reset".
                self.check_token()
                raise
        finally:
            for f in opened.values():
                f.close()

    def check_token(self) -> None:
        """Raise RefusedError when the token is missing, unknown or revoked."""
        self.get("/v1/audit", limit=1)


def _decode(method: str, path: str, response: httpx.Response) -> Any:
    try:
        body: Any = response.json() if response.content else None
    except ValueError:
        body = None
    if response.is_success:
        if body is None and response.content:
            raise ServerError(f"{method} {path}: the answer is not JSON "
                              f"({response.headers.get('content-type', 'no content type')})",
                              fix="check --server points at a ModelFleet API")
        return body
    error = body if isinstance(body, dict) else {}
    detail = str(error.get("detail") or response.reason_phrase or "error")
    cls = RefusedError if 400 <= response.status_code < 500 else ServerError
    fix = error.get("fix")
    if fix is None and response.status_code == 401:
        fix = "pass a token: --token, MODELFLEET_TOKEN or `modelfleet login`"
    if fix is None and cls is ServerError:
        fix = "see the server log; retry later"
    raise cls(message=f"{detail} (HTTP {response.status_code})", fix=fix,
              code=str(error.get("code") or f"http_{response.status_code}"),
              field=error.get("field"), status=response.status_code)
