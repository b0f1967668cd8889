"""``UrllibTransport``: the production ``Transport`` on the standard library (no extra deps).

Built on ``socket``/``ssl`` with ``http.client.HTTPResponse`` parsing the answer, so every
wait is bounded at the socket level rather than between reads:

- each ``recv`` waits at most ``min(idle, time left)``: the headers (redirects included)
  must arrive within the request's ``timeout`` in total, each body read within ``timeout``
  (the idle timeout), and the whole body before the limit the caller sets with
  ``Response.set_time_limit`` (the fetcher passes what is left of the update deadline). A
  mirror that drips one byte a second therefore cannot keep a read — or the update — alive
  past the deadline; a read never waits to fill 64 KiB, it returns what has arrived;
- at most ``max_redirects`` redirects (presigned S3 URLs answer 302), only to http/https
  (a manifest must not make the device read ``file://`` paths), never from https to http;
- every HTTP status comes back as a ``Response`` instead of an exception, so 304/404/416
  reach the updater's logic. Network failures and timeouts raise ``FetchError``.
"""

from __future__ import annotations

import http.client
import io
import socket
import ssl
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any, cast

from client_sdk.errors import FetchError
from client_sdk.transport import Response

_CHUNK = 64 * 1024
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


class _Expired(Exception):
    """The time limit passed before the next byte arrived."""


class _Budget:
    """Per-``recv`` timeouts: the idle timeout, cut to what is left before ``end``."""

    def __init__(self, idle: float, end: float | None) -> None:
        self.idle = idle
        self.end = end

    def recv_timeout(self) -> float:
        if self.end is None:
            return self.idle
        left = self.end - time.monotonic()
        if left <= 0:
            raise _Expired()
        return min(self.idle, left)


class _BoundedReader(io.RawIOBase):
    """The socket as a raw stream whose every ``recv_into`` obeys the budget."""

    def __init__(self, sock: socket.socket, budget: _Budget) -> None:
        self._sock = sock
        self._budget = budget

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._sock.settimeout(self._budget.recv_timeout())
        return self._sock.recv_into(buffer)


class _Connection:
    """What ``http.client.HTTPResponse`` needs from a socket: ``makefile("rb")``."""

    def __init__(self, sock: socket.socket, budget: _Budget) -> None:
        self.sock = sock
        self.budget = budget

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_BoundedReader(self.sock, self.budget))

    def close(self) -> None:
        self.sock.close()


def _check_url(url: str) -> urllib.parse.SplitResult:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise FetchError(f"refusing to fetch non-HTTP URL {url!r}")
    if not parts.hostname or any(c in url for c in "\r\n\t "):
        raise FetchError(f"refusing malformed URL {url!r}")
    return parts


def _request_bytes(parts: urllib.parse.SplitResult, headers: Mapping[str, str],
                   method: str = "GET", body: bytes = b"") -> bytes:
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host = parts.netloc.rsplit("@", 1)[-1]
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Accept-Encoding: identity",
             "Connection: close"]
    if method != "GET":
        lines.append(f"Content-Length: {len(body)}")
    for name, value in headers.items():
        if any(c in f"{name}{value}" for c in "\r\n"):
            raise FetchError(f"refusing header {name!r} with a line break")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _stream(resp: http.client.HTTPResponse, what: str) -> Iterator[bytes]:
    try:
        while True:
            chunk = resp.read1(_CHUNK)
            if not chunk:
                return
            yield chunk
    except _Expired:
        raise FetchError(f"time limit passed while reading {what}") from None
    except TimeoutError:
        raise FetchError(f"{what} stalled: no data within the idle timeout") from None
    except (OSError, http.client.HTTPException) as e:
        raise FetchError(f"connection failed while reading {what}: {e}") from e


class UrllibTransport:
    """HTTP(S) transport on the standard library, with socket-level deadlines (the name is
    historical: it no longer goes through ``urllib.request``)."""

    def __init__(self, *, max_redirects: int = 5, user_agent: str = "modelfleet-client",
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self._max_redirects = max_redirects
        self._user_agent = user_agent
        # Made on the first https request: loading the system's CA certificates costs ~30 ms
        # of CPU, which a device talking plain http to a local mirror, or an app making an
        # Updater per check, would pay for nothing.
        self._ssl = ssl_context

    def fetch(self, url: str, headers: Mapping[str, str], timeout: float) -> Response:
        """GET ``url``. The headers (after redirects) must arrive within ``timeout`` seconds;
        then each body read waits at most ``timeout``."""
        idle = max(timeout, 0.001)
        end = time.monotonic() + idle
        current = url
        for hop in range(self._max_redirects + 1):
            parts = _check_url(current)
            conn, resp = self._open(parts, {"User-Agent": self._user_agent, **headers},
                                    _Budget(idle, end), current)
            location = resp.getheader("location")
            if resp.status not in _REDIRECTS or not location:
                conn.budget.end = None  # headers are in: from now on the idle timeout only
                return self._response(resp, conn, current)
            resp.close()
            conn.close()
            nxt = urllib.parse.urljoin(current, location)
            scheme = urllib.parse.urlsplit(nxt).scheme
            if scheme not in ("http", "https"):
                raise FetchError(f"refusing redirect to non-HTTP URL {nxt!r}")
            if parts.scheme == "https" and scheme == "http":
                raise FetchError(f"refusing redirect from {current} to plain-HTTP {nxt!r} "
                                 "(a downgrade anyone on the path could tamper with)")
            if hop == self._max_redirects:
                break
            current = nxt
        raise FetchError(f"more than {self._max_redirects} redirects fetching {url} "
                         "(a redirect loop?)")

    def post(self, url: str, body: bytes, headers: Mapping[str, str],
             timeout: float) -> Response:
        """POST ``body`` to ``url`` (no redirects followed: a telemetry endpoint does not
        move). The response headers must arrive within ``timeout`` seconds in total, then
        each body read waits at most ``timeout``."""
        idle = max(timeout, 0.001)
        parts = _check_url(url)
        conn, resp = self._open(parts, {"User-Agent": self._user_agent, **headers},
                                _Budget(idle, time.monotonic() + idle), url, "POST", body)
        conn.budget.end = None
        return self._response(resp, conn, url)

    def _tls(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def _open(self, parts: urllib.parse.SplitResult, headers: Mapping[str, str],
              budget: _Budget, url: str, method: str = "GET",
              body: bytes = b"") -> tuple[_Connection, http.client.HTTPResponse]:
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            sock = socket.create_connection((host, port), timeout=budget.recv_timeout())
        except _Expired:
            raise FetchError(f"timed out connecting to {url}") from None
        except TimeoutError as e:
            raise FetchError(f"timed out connecting to {url}: {e}") from e
        except OSError as e:
            raise FetchError(f"cannot reach {url}: {e}") from e
        try:
            if parts.scheme == "https":
                sock.settimeout(budget.recv_timeout())
                sock = self._tls().wrap_socket(sock, server_hostname=host)
            sock.settimeout(budget.recv_timeout())
            sock.sendall(_request_bytes(parts, headers, method, body))
            conn = _Connection(sock, budget)
            # HTTPResponse only calls makefile("rb") on its socket: ours bounds every recv.
            resp = http.client.HTTPResponse(cast(socket.socket, conn), method=method)
            resp.begin()
            return conn, resp
        except BaseException as e:
            sock.close()
            if isinstance(e, _Expired | TimeoutError):
                raise FetchError(f"timed out waiting for the response headers of {url}") from None
            if isinstance(e, OSError | http.client.HTTPException):
                raise FetchError(f"cannot fetch {url}: {e}") from e
            raise

    def _response(self, resp: http.client.HTTPResponse, conn: _Connection,
                  url: str) -> Response:
        hdrs = {k.lower(): v for k, v in resp.getheaders()}

        def close() -> None:
            resp.close()
            conn.close()

        def set_time_limit(seconds: float) -> None:
            conn.budget.end = time.monotonic() + max(seconds, 0.0)

        return Response(resp.status, hdrs, _stream(resp, url), url, close, set_time_limit)
