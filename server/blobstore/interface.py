"""The `BlobStore` interface, its error tree and the streaming helpers both backends share.

Contract every implementation passes (tests/server/test_blobstore_contract.py):
- `put` streams the source (an iterable of byte chunks or a binary file), computes sha256 and
  length on the way, and makes the blob visible only once complete (atomic publish): a reader
  sees the old blob, nothing, or the complete new one, never a prefix. On any failure —
  including `max_bytes` exceeded or `expected_sha256` mismatch — nothing is stored under the
  key and the old blob (if any) is untouched.
- `open`/`iter_range` stream out in chunks; `stat` gives the length; `delete` is idempotent.
- `presigned_url` returns a time-limited GET URL when the backend can serve directly
  (S3), else None (local: serve through the API).
- `content_type` and `cache_control` are the HTTP headers the blob is served with by a backend
  that serves it itself (S3 object metadata: every GET, HEAD and 304 carries them). A local
  directory stores bytes only: the HTTP server in front of it sets both by path (the nginx
  configuration of server/publish/nginxconf.py). Replacing a local blob always advances its
  modification time, so mtime-based validators (nginx's ETag and Last-Modified) change with
  every put, even twice in one second with the same length.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, Protocol, runtime_checkable

CHUNK_SIZE = 1024 * 1024


class BlobStoreError(Exception):
    """Base of every blob store failure."""


class BlobNotFoundError(BlobStoreError):
    def __init__(self, key: str) -> None:
        super().__init__(f"blob {key!r} does not exist")
        self.key = key


class BlobTooLargeError(BlobStoreError):
    def __init__(self, key: str, max_bytes: int) -> None:
        super().__init__(f"blob {key!r} is larger than the limit of {max_bytes} bytes")
        self.key = key
        self.max_bytes = max_bytes


class BlobDigestMismatchError(BlobStoreError):
    def __init__(self, key: str, expected: str, actual: str) -> None:
        super().__init__(f"blob {key!r}: expected sha256 {expected}, got {actual}")
        self.key = key
        self.expected = expected
        self.actual = actual


class InvalidBlobKeyError(BlobStoreError):
    pass


class BlobBackendError(BlobStoreError):
    """The storage backend itself failed; the message carries the backend's reason."""


class BlobStorageFullError(BlobBackendError):
    """The backend has no space left (a local volume's ENOSPC / EDQUOT): nothing new was
    stored; a retry after space is freed succeeds."""


@dataclass(frozen=True)
class BlobInfo:
    key: str
    length: int
    sha256: str | None = None  # known after put; stat() fills it when the backend recorded it
    # stat(): when the blob was last written (POSIX seconds, the backend's clock), None when
    # the backend does not say; what the source GC's grace period is measured from.
    modified: float | None = None


_KEY_RE = re.compile(r"^[A-Za-z0-9._\-+=@/]+$")
MAX_KEY_LENGTH = 512


def validate_key(key: str) -> str:
    """Accepts relative, slash-separated keys of safe characters; no '.'/'..' segments."""
    if not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidBlobKeyError(f"blob key must be 1..{MAX_KEY_LENGTH} characters: {key!r}")
    if not _KEY_RE.fullmatch(key) or key.startswith("/") or key.endswith("/"):
        raise InvalidBlobKeyError(
            f"blob key {key!r} must be relative and use only letters, digits and ._-+=@/"
        )
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise InvalidBlobKeyError(f"blob key {key!r} has an empty, '.' or '..' segment")
    return key


Source = Iterable[bytes] | BinaryIO


def iter_source(source: Source, chunk_size: int = CHUNK_SIZE) -> Iterator[bytes]:
    """Chunks from a binary file (read in chunk_size pieces) or an iterable of bytes."""
    read = getattr(source, "read", None)
    if read is not None:
        while True:
            chunk = read(chunk_size)
            if not chunk:
                return
            yield bytes(chunk)
    else:
        for chunk in source:
            if chunk:
                yield bytes(chunk)


class HashingCounter:
    """sha256 + length of everything passed through `update`, with a size cap."""

    def __init__(self, key: str, max_bytes: int | None) -> None:
        self.key = key
        self.max_bytes = max_bytes
        self.length = 0
        self._sha = hashlib.sha256()

    def update(self, chunk: bytes) -> None:
        self.length += len(chunk)
        if self.max_bytes is not None and self.length > self.max_bytes:
            raise BlobTooLargeError(self.key, self.max_bytes)
        self._sha.update(chunk)

    def hexdigest(self) -> str:
        return self._sha.hexdigest()

    def check(self, expected_sha256: str | None) -> str:
        digest = self.hexdigest()
        if expected_sha256 is not None and digest != expected_sha256.lower():
            raise BlobDigestMismatchError(self.key, expected_sha256, digest)
        return digest


@runtime_checkable
class BlobStore(Protocol):
    """Where every file of the system lives (sources, artifacts, patches, manifests)."""

    def put(
        self,
        key: str,
        source: Source,
        *,
        max_bytes: int | None = None,
        expected_sha256: str | None = None,
        content_type: str = "application/octet-stream",
        cache_control: str | None = None,
    ) -> BlobInfo:
        """Stores `source` under `key` atomically (replacing any old blob) and returns its
        sha256 and length (`content_type`, `cache_control`: see the module docstring).
        Raises BlobTooLargeError, BlobDigestMismatchError, InvalidBlobKeyError,
        BlobBackendError — in every case nothing new is visible."""
        ...

    def open(self, key: str) -> BinaryIO:
        """A readable binary stream of the blob (close it). Raises BlobNotFoundError."""
        ...

    def iter_range(
        self, key: str, start: int = 0, end: int | None = None, chunk_size: int = CHUNK_SIZE
    ) -> Iterator[bytes]:
        """Bytes [start, end) (end=None: to the end), in chunks. Raises BlobNotFoundError
        (eagerly, before the first chunk) and BlobStoreError for an invalid range."""
        ...

    def stat(self, key: str) -> BlobInfo:
        """Length, last-write time (and sha256 when recorded at put). Raises
        BlobNotFoundError."""
        ...

    def exists(self, key: str) -> bool: ...

    def delete(self, key: str) -> None:
        """Removes the blob; deleting a missing key is not an error."""
        ...

    def list_keys(self, prefix: str = "") -> Iterator[str]:
        """Every key starting with `prefix`, sorted."""
        ...

    def presigned_url(self, key: str, expires_in: int = 3600) -> str | None:
        """A time-limited direct GET URL, or None when the backend has none (local)."""
        ...

    def check_ready(self) -> None:
        """Cheap readiness probe (GET /readyz): returns when the store can be used, raises
        BlobBackendError saying why not (directory missing or read-only, bucket missing,
        credentials refused, endpoint down)."""
        ...


def check_range(length: int, start: int, end: int | None) -> int:
    """Validates [start, end) against a blob of `length`; returns the resolved end."""
    resolved = length if end is None else end
    if start < 0 or resolved < start or resolved > length:
        raise BlobStoreError(f"invalid byte range [{start}, {end}) for a blob of {length} bytes")
    return resolved
