"""The SDK's single I/O seam to the network: the ``Transport`` protocol and its ``Response``.

Everything the updater downloads goes through ``Transport.fetch``; telemetry and enrolment
go through ``Transport.post``. Tests swap in an in-memory
repository simulator; production uses ``client_sdk.http.UrllibTransport``. Caps and deadlines
are enforced by the caller while it iterates ``Response.chunks`` so every transport gets them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol


def _no_close() -> None:
    return None


def _no_time_limit(seconds: float) -> None:
    return None


@dataclass
class Response:
    """An HTTP-like response whose body is read lazily, chunk by chunk.

    ``headers`` keys are lower-case. ``chunks`` may raise ``FetchError`` mid-stream (a cut
    connection). ``close`` releases the connection; callers always call it.
    ``set_time_limit(seconds)`` asks the transport to end the body read (``FetchError``)
    once ``seconds`` have passed; a transport that can enforce that at the socket level does
    (``UrllibTransport``), others ignore it and the caller's checks between chunks apply.
    """

    status: int
    headers: Mapping[str, str]
    chunks: Iterator[bytes]
    url: str = ""
    close: Callable[[], None] = field(default=_no_close)
    set_time_limit: Callable[[float], None] = field(default=_no_time_limit)


class Transport(Protocol):
    """Fetches one URL. Returns 2xx/3xx/4xx/5xx as a Response (never raises for a status);
    raises ``FetchError`` for network failures. ``timeout`` bounds each blocking read (and,
    for ``UrllibTransport``, the wait for the response headers in total)."""

    def fetch(self, url: str, headers: Mapping[str, str], timeout: float) -> Response: ...

    def post(self, url: str, body: bytes, headers: Mapping[str, str],
             timeout: float) -> Response:
        """POST ``body``; same status, error and timeout rules as ``fetch``."""
        ...
