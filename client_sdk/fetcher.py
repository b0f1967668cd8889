"""Bounded downloads over a ``Transport``: byte caps, an overall deadline, resumable files.

Every read is capped (a body longer than declared is an attack, not a bigger file) and checked
against one ``Deadline`` shared by a whole update cycle, so a server that drips bytes cannot
hold the device forever: the transport gets what is left of it as the response's time limit
(``Response.set_time_limit``, enforced per ``recv`` by ``UrllibTransport``), and a transport
failure once the deadline has passed is reported as ``DeadlineExceededError``.

File downloads land in ``<sha256>.part`` files: because the partial
file is named after the hash the manifest promises, a download resumes with HTTP Range only
while the expected hash is unchanged; a changed artifact starts from zero.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from client_sdk.clock import Clock
from client_sdk.errors import DeadlineExceededError, FetchError, IntegrityError, OversizeError
from client_sdk.fsutil import sha256_file
from client_sdk.transport import Response, Transport

Progress = Callable[[int, int], None]
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


class Deadline:
    """An absolute point on the monotonic clock after which fetching stops."""

    def __init__(self, clock: Clock, seconds: float) -> None:
        self._clock = clock
        self._seconds = seconds
        self._end = clock.monotonic() + seconds

    def remaining(self) -> float:
        return self._end - self._clock.monotonic()

    def check(self, what: str) -> None:
        if self.remaining() <= 0:
            raise DeadlineExceededError(
                f"update deadline of {self._seconds:g}s passed while {what}; the server is too "
                "slow or stalled (raise update_deadline_seconds if the link is just slow)"
            )


@dataclass(frozen=True)
class Fetched:
    status: int
    headers: Mapping[str, str]
    body: bytes


def _timeout(deadline: Deadline, per_request: float) -> float:
    return max(0.001, min(per_request, deadline.remaining()))


def _open(transport: Transport, url: str, headers: Mapping[str, str], deadline: Deadline,
          request_timeout: float) -> Response:
    """``transport.fetch`` with the headers due before the deadline and the body's time
    limit set to what is left of it."""
    deadline.check(f"requesting {url}")
    try:
        resp = transport.fetch(url, headers, _timeout(deadline, request_timeout))
    except FetchError:
        deadline.check(f"waiting for {url}")  # the deadline is why: say so, typed
        raise
    resp.set_time_limit(max(deadline.remaining(), 0.0))
    return resp


def _chunks(resp: Response, deadline: Deadline, url: str) -> Iterator[bytes]:
    try:
        yield from resp.chunks
    except FetchError:
        deadline.check(f"reading {url}")
        raise


def fetch_bytes(
    transport: Transport,
    url: str,
    *,
    max_bytes: int,
    deadline: Deadline,
    request_timeout: float,
    headers: Mapping[str, str] | None = None,
    what: str = "document",
) -> Fetched:
    """Fetch a small document fully into memory, refusing more than ``max_bytes``."""
    resp = _open(transport, url, dict(headers or {}), deadline, request_timeout)
    try:
        declared = resp.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            raise OversizeError(
                f"{what} at {url} declares {declared} bytes, over the {max_bytes}-byte cap"
            )
        buf = bytearray()
        for chunk in _chunks(resp, deadline, url):
            buf += chunk
            if len(buf) > max_bytes:
                raise OversizeError(f"{what} at {url} is longer than the {max_bytes}-byte cap")
            deadline.check(f"reading {url}")
        return Fetched(resp.status, resp.headers, bytes(buf))
    finally:
        resp.close()


def _start(
    transport: Transport, url: str, offset: int, deadline: Deadline, request_timeout: float
) -> Response:
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    return _open(transport, url, headers, deadline, request_timeout)


def download_file(
    transport: Transport,
    url: str,
    part: Path,
    *,
    length: int,
    sha256: str,
    deadline: Deadline,
    request_timeout: float,
    progress: Progress | None = None,
) -> Path:
    """Download ``url`` into ``part`` (resuming it), verify length and sha256, return ``part``.

    Raises FetchError/DeadlineExceededError with the partial file kept (a later call resumes),
    OversizeError or IntegrityError with the partial file deleted (those bytes are bad).
    """
    part.parent.mkdir(parents=True, exist_ok=True)
    offset = part.stat().st_size if part.exists() else 0
    if offset > length:
        part.unlink()
        offset = 0
    for _attempt in range(2):
        if offset == length:
            break
        resp = _start(transport, url, offset, deadline, request_timeout)
        try:
            if resp.status == 416 or (resp.status == 200 and offset):
                # The server cannot serve our range (or ignores Range): start over from zero.
                offset = 0
                part.unlink(missing_ok=True)
                if resp.status == 416:
                    continue
            elif resp.status == 206:
                m = _CONTENT_RANGE.fullmatch(resp.headers.get("content-range", ""))
                if not m or int(m.group(1)) != offset:
                    part.unlink(missing_ok=True)
                    raise FetchError(f"server answered {url} with the wrong range; retrying later")
            elif resp.status != 200:
                raise FetchError(f"HTTP {resp.status} fetching {url}")
            offset = _write_body(resp, part, offset, length, url, deadline, progress)
        finally:
            resp.close()
        break
    if offset < length:
        raise FetchError(
            f"connection closed after {offset} of {length} bytes of {url}; will resume"
        )
    actual = sha256_file(part)
    if actual != sha256:
        part.unlink()
        raise IntegrityError(
            f"{url}: sha256 {actual} does not match the signed {sha256}; the file was tampered "
            "with or corrupted in transit and was discarded"
        )
    return part


def _write_body(
    resp: Response,
    part: Path,
    offset: int,
    length: int,
    url: str,
    deadline: Deadline,
    progress: Progress | None,
) -> int:
    declared = resp.headers.get("content-length")
    if declared is not None and declared.isdigit() and offset + int(declared) > length:
        part.unlink(missing_ok=True)
        raise OversizeError(
            f"{url} declares {declared} more bytes, beyond the signed length {length}"
        )
    with open(part, "ab" if offset else "wb") as f:
        try:
            for chunk in _chunks(resp, deadline, url):
                if offset + len(chunk) > length:
                    f.close()
                    part.unlink(missing_ok=True)
                    raise OversizeError(
                        f"{url} sent more than its signed length of {length} bytes (endless data)"
                    )
                f.write(chunk)
                offset += len(chunk)
                if progress is not None:
                    progress(offset, length)
                deadline.check(f"downloading {url} ({offset}/{length} bytes)")
        finally:
            if not f.closed:
                f.flush()
                os.fsync(f.fileno())
    return offset
