"""Blob storage behind one interface: local directory (embedded default) and S3 (production).

Errors (one base, translated from each backend's own exceptions at the edge):

    BlobStoreError
    ├── BlobNotFoundError     the key does not exist
    ├── BlobTooLargeError     the stream passed max_bytes; nothing was stored
    ├── BlobDigestMismatchError  the stream's sha256 differs from the expected one; nothing stored
    ├── InvalidBlobKeyError   empty key, '..', absolute path, backslash or control characters
    └── BlobBackendError      the backend failed (S3 unreachable, access denied …)
        └── BlobStorageFullError  no space left on the backend's volume; nothing stored
"""

from __future__ import annotations

from server.blobstore.interface import (
    CHUNK_SIZE,
    BlobBackendError,
    BlobDigestMismatchError,
    BlobInfo,
    BlobNotFoundError,
    BlobStorageFullError,
    BlobStore,
    BlobStoreError,
    BlobTooLargeError,
    InvalidBlobKeyError,
    validate_key,
)
from server.blobstore.local import LocalBlobStore
from server.settings import Settings

__all__ = [
    "CHUNK_SIZE",
    "BlobBackendError",
    "BlobDigestMismatchError",
    "BlobInfo",
    "BlobNotFoundError",
    "BlobStorageFullError",
    "BlobStore",
    "BlobStoreError",
    "BlobTooLargeError",
    "InvalidBlobKeyError",
    "LocalBlobStore",
    "make_blob_store",
    "validate_key",
]


def make_blob_store(settings: Settings) -> BlobStore:
    """The store chosen by `Settings.blob_store` (`local` or `s3`)."""
    if settings.blob_store == "s3":
        from server.blobstore.s3 import S3BlobStore

        return S3BlobStore(
            bucket=settings.s3_bucket,
            endpoint_url=settings.s3_endpoint_url or None,
            region=settings.s3_region,
            access_key=settings.s3_access_key_id or None,
            secret_key=settings.s3_secret_access_key or None,
            prefix=settings.s3_prefix,
            max_attempts=settings.s3_max_attempts,
            connect_timeout=settings.s3_connect_timeout_seconds,
            read_timeout=settings.s3_read_timeout_seconds,
        )
    return LocalBlobStore(settings.resolved_blob_dir)
