"""Device telemetry answered inside uvicorn's HTTP protocol, before any ASGI work.

`DeviceProtocol` is `ManifestPollProtocol` (server/api/fastpoll.py: fresh manifest polls)
plus a second shortcut: a `POST /v1/telemetry` has its body collected from the parser
callbacks and answered by writing the response bytes to the socket, skipping uvicorn's
request cycle (scope, receive/send, an Event and header validation per request) — profiled at
≈ 0.6 ms of a 1.07 ms request, more than the ingest itself. The rules are the raw route's
(server/api/fasttelemetry.py), shared with it, so the answers are the same:

1. a declared Content-Length over `max_telemetry_body_bytes` is a 413 with `connection: close`
   before a byte of the body is taken; a stream (chunked, or no length) that passes the cap is
   cut off with the same 413 and the connection closed; JSON nested too deep is a 422 (close);
2. the exact body bytes go to `fasttelemetry.answer` → `Fleet.receive`, which verifies the
   signature before parsing, rate limits (429 + Retry-After), refuses unknown / revoked /
   replayed-stale devices (401) and stores through the group commit; 200 means committed.

The request is answered from a task (the ingest awaits the group commit); until it is, any
request behind it on the connection waits its turn in uvicorn's pipeline, and a poll behind it
is not answered early. Everything unusual goes through uvicorn and the app unchanged: a
request pipelined behind an unfinished one, `Expect: 100-continue`, a root path, a paused
transport, an upgrade, `limit_concurrency`, and with `Settings.log_polls` all device traffic.
Requests answered here are what server/api/observe.py makes of the ASGI path — an
X-Request-Id (a sane incoming one, else new) echoed and set in `REQUEST_ID` for the request's
log records, a count in `modelfleet_http_requests` — except the access-log line, as for polls.

    uvicorn server.asgi:app --http server.api.fastingest:DeviceProtocol --loop uvloop
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from server.api.fastpoll import DEFAULT_HEADERS, ManifestPollProtocol, find_serving_app
from server.api.fasttelemetry import answer
from server.api.guard import declared_length, too_deep_payload, too_large_payload
from server.json_depth import too_deep
from server.observability.logs import REQUEST_ID, request_id_from
from server.observability.metrics import HTTP_REQUESTS
from server.publish.manifest_cache import CachedManifest
from server.services.fleet.service import Fleet

PATH = b"/v1/telemetry"
PATH_LABEL = "/v1/telemetry"  # its route label in modelfleet_http_requests
_CLOSE = b"connection: close\r\n"
_500 = (b"content-length: 21\r\ncontent-type: text/plain; charset=utf-8\r\n" + _CLOSE
        + b"\r\nInternal Server Error")


def _header(headers: list[tuple[bytes, bytes]], wanted: bytes) -> str | None:
    for name, value in headers:
        if name == wanted:
            return value.decode("latin-1")
    return None


class DeviceProtocol(ManifestPollProtocol):
    """uvicorn's httptools protocol answering fresh polls and telemetry itself (see module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        serving = find_serving_app(self.app)
        self._fleet: Fleet | None = None
        self._cap = 0
        if serving is not None and not self.root_path and self.limit_concurrency is None:
            settings = serving.state.services.settings
            if not settings.log_polls:  # logged device traffic takes the app's access log
                self._fleet = serving.state.services.fleet
                self._cap = settings.max_telemetry_body_bytes
        self._chunks: list[bytes] | None = None  # the body of a telemetry request being read
        self._size = 0
        self._refused = False  # answered early (413): the rest of the message is dropped
        self._inflight: asyncio.Task[None] | None = None
        self._close_after = False  # shutdown asked while a telemetry answer was pending

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        self._chunks = None
        self._refused = False
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        if self._fleet is not None and self._telemetry():
            return
        super().on_headers_complete()

    def _telemetry(self) -> bool:
        """Takes this request when it is a plain telemetry POST (see module)."""
        if self.url.partition(b"?")[0] != PATH or self.parser.get_method() != b"POST":
            return False
        cycle = self.cycle
        if ((cycle is not None and not cycle.response_complete) or self.pipeline
                or self._inflight is not None or self.flow.write_paused
                or self.expect_100_continue or self.parser.should_upgrade()):
            return False
        declared = declared_length(self.headers)
        if declared is not None and declared > self._cap:
            self._refuse(413, too_large_payload(self._cap))
            return True
        self._chunks, self._size = [], 0
        return True

    def on_body(self, body: bytes) -> None:
        chunks = self._chunks
        if chunks is None:
            if not self._refused:
                super().on_body(body)
            return
        self._size += len(body)
        if self._size > self._cap:
            self._chunks = None
            self._refuse(413, too_large_payload(self._cap))
            return
        chunks.append(body)

    def on_message_complete(self) -> None:
        chunks = self._chunks
        if chunks is None:
            if not self._refused:
                super().on_message_complete()
            return
        self._chunks = None
        body = b"".join(chunks)
        if too_deep(body):
            self._refuse(422, too_deep_payload())
            return
        assert self._fleet is not None
        keep_alive = (self.parser.get_http_version() != "1.0"
                      and self.parser.should_keep_alive())
        task = self.loop.create_task(self._ingest(
            self._fleet, _header(self.headers, b"x-device-id"),
            _header(self.headers, b"x-device-signature"), body, keep_alive,
            request_id_from(_header(self.headers, b"x-request-id"))))
        self._inflight = task
        self.tasks.add(task)  # the server waits for it on shutdown
        task.add_done_callback(self.tasks.discard)

    # ------------------------------------------------------------------ answers

    async def _ingest(self, fleet: Fleet, device_id: str | None, signature: str | None,
                      body: bytes, keep_alive: bool, request_id: str) -> None:
        # As server/api/observe.py does on the ASGI path: the id in every log record of the
        # request (this task's own context), echoed last, the request counted.
        REQUEST_ID.set(request_id)
        try:
            status, payload, extra = await answer(fleet, device_id, signature, body)
        except Exception:  # what uvicorn does for an app exception: log, 500, close
            self.logger.exception("Exception in telemetry request")
            self._inflight = None
            HTTP_REQUESTS.labels("POST", PATH_LABEL, "500").inc()
            self._write(STATUS_LINE[500] + DEFAULT_HEADERS.get(
                self.server_state.default_headers) + _500, keep_alive=False)
            return
        self._inflight = None
        HTTP_REQUESTS.labels("POST", PATH_LABEL, str(status)).inc()
        keep_alive = keep_alive and not self._close_after
        head = [STATUS_LINE[status], DEFAULT_HEADERS.get(self.server_state.default_headers),
                b"content-type: application/json\r\ncontent-length: %d\r\n" % len(payload)]
        head.extend(name + b": " + value + b"\r\n" for name, value in extra)
        head.append(b"x-request-id: " + request_id.encode() + b"\r\n")
        if not keep_alive:
            head.append(_CLOSE)
        head.append(b"\r\n")
        head.append(payload)
        self._write(b"".join(head), keep_alive=keep_alive)

    def _refuse(self, status: int, payload: bytes) -> None:
        """An answer before the body was taken, as the guard's: `connection: close`."""
        self._refused = True
        HTTP_REQUESTS.labels("POST", PATH_LABEL, str(status)).inc()
        request_id = request_id_from(_header(self.headers, b"x-request-id")).encode()
        self._write(b"".join((STATUS_LINE[status],
                              DEFAULT_HEADERS.get(self.server_state.default_headers),
                              b"content-type: application/json\r\ncontent-length: %d\r\n"
                              % len(payload), _CLOSE, b"x-request-id: ", request_id, b"\r\n",
                              b"\r\n", payload)), keep_alive=False)

    def _write(self, out: bytes, *, keep_alive: bool) -> None:
        if not self.transport.is_closing():  # else the client went away; nothing to answer
            self._send_answer(out, keep_alive)

    def _next_request(self) -> None:
        if self.pipeline:  # requests that arrived meanwhile, in order (uvicorn's own queue)
            self.flow.resume_reading()
            cycle, app = self.pipeline.pop()
            super()._start_asgi_task(cycle, app)
            return
        super()._next_request()

    # ------------------------------------------------------------------ ordering

    def _fresh_poll(self) -> CachedManifest | None:
        # A poll behind a pending telemetry answer must not overtake it.
        return None if self._inflight is not None else super()._fresh_poll()

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if self._inflight is not None:  # queued behind the pending answer, as uvicorn queues
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, app))
            return
        super()._start_asgi_task(cycle, app)

    def shutdown(self) -> None:
        if self._inflight is not None:
            self._close_after = True  # answer, then close
            return
        super().shutdown()
