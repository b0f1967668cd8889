"""Manifest polls answered inside uvicorn's HTTP protocol, before any ASGI work.

`ManifestPollProtocol` is uvicorn's httptools protocol plus one shortcut: a `GET
/v1/channels/{channel}/manifest` for which the app's `ManifestCache.lookup` has an entry
(fresh, or stale while one reload runs: server/publish/manifest_cache.py) is answered by
writing the cached status line, headers and bytes straight to the socket from the parser
callback, with the same `not_modified` rule as the other poll paths. Profiled,
most of a poll's cost under uvicorn was the per-request ASGI machinery (scope, an asyncio
task and an Event per request, header validation in `send`), not the app's own code.

Everything else — other paths and methods, a missing cache entry or one past its stale
limit (the route loads it), a pipelined request behind an unfinished one, a paused
transport, a root path — goes through uvicorn and the app unchanged. The bytes on the wire
are the ones the ASGI path sends: uvicorn's default headers (Date, Server), then the app's
ETag, Cache-Control (and for a 200 Content-Type, Content-Length), `connection: close` when
the connection does not stay open.

Polls answered here write no access-log line and carry no X-Request-Id; they are counted
in `ManifestCache.stats` (plain ints; server/observability/metrics.py exports them). With
`Settings.log_polls` (MODELFLEET_LOG_POLLS=1) every poll goes through the logged ASGI path
instead.

    uvicorn server.asgi:app --http server.api.fastpoll:ManifestPollProtocol --loop uvloop
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from server.api.serving import ServingFastAPI, request_if_none_match
from server.publish.manifest_cache import CachedManifest, ManifestCache

PREFIX = b"/v1/channels/"
SUFFIX = b"/manifest"
_STATUS_200 = STATUS_LINE[200]
_STATUS_304 = STATUS_LINE[304]
_CLOSE = b"connection: close\r\n"


def find_serving_app(app: Any) -> ServingFastAPI | None:
    """The ServingFastAPI under uvicorn's wrappers (ProxyHeadersMiddleware, …)."""
    for _ in range(16):  # wrappers keep the inner app in `.app`; never loop forever
        if isinstance(app, ServingFastAPI):
            return app
        app = getattr(app, "app", None)
        if app is None:
            return None
    return None


class _DefaultHeaderLines:
    """uvicorn's default headers (Date changes once a second) as header lines, rebuilt only
    when the server swaps in a new list."""

    def __init__(self) -> None:
        self._source: object = None
        self._lines = b""

    def get(self, headers: list[tuple[bytes, bytes]]) -> bytes:
        if headers is not self._source:
            self._lines = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
            self._source = headers
        return self._lines


DEFAULT_HEADERS = _DefaultHeaderLines()


class ManifestPollProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol that answers fresh manifest polls itself (see module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        serving = find_serving_app(self.app)
        # Polls through the access log need the ASGI path (the app writes the access log:
        # server/api/observe.py), so logging polls switches the shortcut off.
        logging_polls = serving is not None and serving.state.services.settings.log_polls
        self._cache: ManifestCache | None = (
            None if (serving is None or logging_polls or self.root_path)
            else serving.manifest_cache)
        self._poll: CachedManifest | None = None

    def on_message_begin(self) -> None:
        self._poll = None
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        if self._cache is not None:
            entry = self._fresh_poll()
            if entry is not None:
                self._poll = entry  # answered once the request is complete
                return
        super().on_headers_complete()

    def _fresh_poll(self) -> CachedManifest | None:
        url = self.url
        if not url.startswith(PREFIX):
            return None
        path = url.partition(b"?")[0]
        if not path.endswith(SUFFIX) or self.parser.get_method() != b"GET":
            return None
        cycle = self.cycle
        # A request pipelined behind an unfinished one must wait its turn; a client that is
        # not reading gets uvicorn's flow control; upgrades are uvicorn's business.
        if ((cycle is not None and not cycle.response_complete) or self.pipeline
                or self.flow.write_paused or self.parser.should_upgrade()):
            return None
        assert self._cache is not None
        # Percent-encoded or otherwise odd names never match a cached channel name.
        entry = self._cache.lookup(path[len(PREFIX):-len(SUFFIX)].decode("latin-1"))
        if entry is not None:
            self._cache.stats.shortcut += 1
        return entry

    def on_body(self, body: bytes) -> None:
        if self._poll is None:
            super().on_body(body)

    def on_message_complete(self) -> None:
        entry = self._poll
        if entry is None:
            super().on_message_complete()
            return
        self._poll = None
        self._answer(entry)

    def _answer(self, entry: CachedManifest) -> None:
        if self.transport.is_closing():  # the client went away; nothing to answer
            return
        keep_alive = (self.parser.get_http_version() != "1.0"
                      and self.parser.should_keep_alive())
        default = DEFAULT_HEADERS.get(self.server_state.default_headers)
        close = b"" if keep_alive else _CLOSE
        if entry.not_modified(request_if_none_match(self.headers)):
            out = b"".join((_STATUS_304, default, entry.raw_304, close, b"\r\n"))
            if self._cache is not None:  # always set here: only the shortcut answers
                self._cache.stats.shortcut_304 += 1
        else:
            out = b"".join((_STATUS_200, default, entry.raw_200, close, b"\r\n", entry.data))
        self._send_answer(out, keep_alive)

    def _send_answer(self, out: bytes, keep_alive: bool) -> None:
        """Writes a whole answer, then closes or waits for the connection's next request."""
        self.transport.write(out)
        self.server_state.total_requests += 1
        if not keep_alive:
            self.transport.close()
            return
        self._unset_keepalive_if_required()
        self._next_request()

    def _next_request(self) -> None:
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler)
