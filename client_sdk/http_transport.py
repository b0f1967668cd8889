"""``UrllibTransport``: the production ``Transport`` on the standard library (no extra deps).

Follows up to ``max_redirects`` redirects (presigned S3 URLs answer 302), refuses any scheme but
http/https (a manifest must not make the device read ``file://`` paths), and reports every HTTP
status as a ``Response`` instead of raising, so 304/404/416 reach the updater's logic.
"""

from __future__ import annotations

import http.client
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

from client_sdk.errors import FetchError
from client_sdk.transport import Response

_CHUNK = 64 * 1024


class _LimitedRedirects(urllib.request.HTTPRedirectHandler):
    def __init__(self, max_redirects: int) -> None:
        super().__init__()
        # typeshed declares max_redirections a ClassVar; urllib reads it per instance too
        self.max_redirections = max_redirects  # type: ignore[misc]

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        scheme = urllib.parse.urlsplit(newurl).scheme
        if scheme not in ("http", "https"):
            raise FetchError(f"refusing redirect to non-HTTP URL {newurl!r}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _stream(resp: Any) -> Iterator[bytes]:
    try:
        while True:
            chunk = resp.read(_CHUNK)
            if not chunk:
                return
            yield chunk
    except (OSError, http.client.HTTPException) as e:
        raise FetchError(f"connection failed while reading the body: {e}") from e


class UrllibTransport:
    """HTTP(S) transport built on ``urllib.request``."""

    def __init__(self, *, max_redirects: int = 5, user_agent: str = "modelfleet-client") -> None:
        self._opener = urllib.request.build_opener(_LimitedRedirects(max_redirects))
        self._user_agent = user_agent

    def fetch(self, url: str, headers: Mapping[str, str], timeout: float) -> Response:
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise FetchError(f"refusing to fetch non-HTTP URL {url!r}")
        # Scheme checked above (and on every redirect): only http/https are ever opened.
        req = urllib.request.Request(  # noqa: S310
            url, headers={"User-Agent": self._user_agent, **headers}
        )
        try:
            resp = self._opener.open(req, timeout=max(timeout, 0.001))
        except urllib.error.HTTPError as e:
            hdrs = {k.lower(): v for k, v in e.headers.items()} if e.headers else {}
            return Response(e.code, hdrs, _stream(e), e.geturl() or url, e.close)
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            if isinstance(reason, socket.timeout | TimeoutError):
                raise FetchError(f"timed out connecting to {url}: {reason}") from e
            raise FetchError(f"cannot reach {url}: {reason}") from e
        hdrs = {k.lower(): v for k, v in resp.headers.items()}
        return Response(resp.status, hdrs, _stream(resp), resp.geturl(), resp.close)
