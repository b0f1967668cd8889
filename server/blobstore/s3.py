"""S3 blob store (AWS S3, MinIO, R2 … any S3-compatible endpoint) via boto3.

Streaming in: chunks are hashed and buffered up to one part (`part_size`, default 8 MiB) —
a small blob goes up in one PutObject, a large one as a multipart upload, so memory stays at
one part whatever the blob size. S3 makes an object visible only when PutObject or
CompleteMultipartUpload succeeds, which is the atomic publish: on any failure (size cap,
digest mismatch, source error, backend error) the multipart upload is aborted and nothing
appears under the key. botocore errors are translated to `BlobStoreError`s here and nowhere
else.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from server.blobstore.interface import (
    CHUNK_SIZE,
    BlobBackendError,
    BlobInfo,
    BlobNotFoundError,
    BlobStoreError,
    HashingCounter,
    Source,
    check_range,
    iter_source,
    validate_key,
)

MIN_PART_SIZE = 5 * 1024 * 1024  # S3's floor for every part but the last
DEFAULT_PART_SIZE = 8 * 1024 * 1024
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})

T = TypeVar("T")


class S3BlobStore:
    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        access_key: str | None = None,
        secret_key: str | None = None,
        prefix: str = "",
        part_size: int = DEFAULT_PART_SIZE,
        max_attempts: int = 5,
        connect_timeout: float = 10,
        read_timeout: float = 120,
        client: Any = None,
    ) -> None:
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size must be at least {MIN_PART_SIZE} bytes (S3's minimum)")
        self.bucket = bucket
        self.prefix = prefix
        self.part_size = part_size
        if client is None:
            client = boto3.client(
                "s3",
                endpoint_url=endpoint_url,
                region_name=region,
                aws_access_key_id=access_key,
                aws_secret_access_key=secret_key,
                config=Config(
                    signature_version="s3v4",
                    # Path-style works on MinIO/moto and on AWS; virtual-host needs DNS.
                    s3={"addressing_style": "path" if endpoint_url else "auto"},
                    # botocore's own retry with backoff (refused, reset, timed out, 5xx,
                    # throttled); every call of a put resends a whole part, so a retried
                    # call never stores a mix (docs/architecture.md "Outages").
                    retries={"max_attempts": max_attempts, "mode": "standard"},
                    connect_timeout=connect_timeout,
                    read_timeout=read_timeout,
                ),
            )
        self._s3 = client

    def __repr__(self) -> str:
        return f"S3BlobStore(bucket={self.bucket!r}, prefix={self.prefix!r})"

    def _full(self, key: str) -> str:
        return self.prefix + validate_key(key)

    def _call(self, what: str, key: str, fn: Callable[[], T]) -> T:
        """Runs one S3 call, translating botocore's errors at this edge."""
        try:
            return fn()
        except ClientError as e:
            err = e.response.get("Error", {})
            code = str(err.get("Code", ""))
            if code in _NOT_FOUND_CODES:
                raise BlobNotFoundError(key) from e
            raise BlobBackendError(
                f"S3 {what} of {key!r} in bucket {self.bucket!r} failed: "
                f"{code} {err.get('Message', '')}".rstrip()
            ) from e
        except BotoCoreError as e:
            raise BlobBackendError(
                f"S3 {what} of {key!r} in bucket {self.bucket!r} failed: {e}"
            ) from e

    # ------------------------------------------------------------------ write

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
        full = self._full(key)
        # Object metadata S3 returns as HTTP headers on every GET, HEAD and 304.
        http = {"ContentType": content_type,
                **({"CacheControl": cache_control} if cache_control else {})}
        counter = HashingCounter(key, max_bytes)
        chunks = iter_source(source, min(CHUNK_SIZE, self.part_size))
        buffer = bytearray()
        # Fill the first part; if the source ends first, one PutObject suffices.
        more = False
        for chunk in chunks:
            counter.update(chunk)
            buffer += chunk
            if len(buffer) >= self.part_size:
                more = True
                break
        if not more:
            return self._put_small(key, full, counter, bytes(buffer), expected_sha256, http)
        return self._multipart(key, full, counter, buffer, chunks, expected_sha256, http)

    def _put_small(
        self,
        key: str,
        full: str,
        counter: HashingCounter,
        body: bytes,
        expected_sha256: str | None,
        http: dict[str, str],
    ) -> BlobInfo:
        digest = counter.check(expected_sha256)
        self._call("put", key, lambda: self._s3.put_object(
            Bucket=self.bucket, Key=full, Body=body, Metadata={"sha256": digest}, **http,
        ))
        return BlobInfo(key=key, length=counter.length, sha256=digest)

    def _multipart(
        self,
        key: str,
        full: str,
        counter: HashingCounter,
        buffer: bytearray,
        chunks: Iterator[bytes],
        expected_sha256: str | None,
        http: dict[str, str],
    ) -> BlobInfo:
        created = self._call("multipart start", key, lambda: self._s3.create_multipart_upload(
            Bucket=self.bucket, Key=full, **http,
        ))
        upload_id = created["UploadId"]
        parts: list[dict[str, Any]] = []

        def send(data: bytes) -> None:
            number = len(parts) + 1
            result = self._call("part upload", key, lambda: self._s3.upload_part(
                Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=number, Body=data,
            ))
            parts.append({"PartNumber": number, "ETag": result["ETag"]})

        try:
            while len(buffer) >= self.part_size:
                send(bytes(buffer[: self.part_size]))
                del buffer[: self.part_size]
            for chunk in chunks:
                counter.update(chunk)
                buffer += chunk
                while len(buffer) >= self.part_size:
                    send(bytes(buffer[: self.part_size]))
                    del buffer[: self.part_size]
            if buffer:
                send(bytes(buffer))
            # Check before completing: a mismatched blob must never become visible.
            digest = counter.check(expected_sha256)
            self._call("multipart complete", key, lambda: self._s3.complete_multipart_upload(
                Bucket=self.bucket, Key=full, UploadId=upload_id,
                MultipartUpload={"Parts": parts},
            ))
        except BaseException:
            self._abort(full, upload_id)
            raise
        return BlobInfo(key=key, length=counter.length, sha256=digest)

    def _abort(self, full: str, upload_id: str) -> None:
        try:
            self._s3.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
        except (ClientError, BotoCoreError):
            # Leftover parts are invisible and a bucket lifecycle rule expires them; the
            # original error is the one the caller needs to see.
            pass

    # ------------------------------------------------------------------ read

    def open(self, key: str) -> BinaryIO:
        full = self._full(key)
        obj = self._call("get", key, lambda: self._s3.get_object(Bucket=self.bucket, Key=full))
        return io.BufferedReader(_BodyReader(obj["Body"], self, key), buffer_size=CHUNK_SIZE)

    def iter_range(
        self, key: str, start: int = 0, end: int | None = None, chunk_size: int = CHUNK_SIZE
    ) -> Iterator[bytes]:
        length = self.stat(key).length
        stop = check_range(length, start, end)
        if stop == start:
            return iter(())
        full = self._full(key)
        obj = self._call("ranged get", key, lambda: self._s3.get_object(
            Bucket=self.bucket, Key=full, Range=f"bytes={start}-{stop - 1}",
        ))
        return self._stream(key, obj["Body"], chunk_size)

    def _stream(self, key: str, body: Any, chunk_size: int) -> Iterator[bytes]:
        try:
            while True:
                chunk = self._call("read", key, lambda: body.read(chunk_size))
                if not chunk:
                    return
                yield chunk
        finally:
            body.close()

    def stat(self, key: str) -> BlobInfo:
        full = self._full(key)
        head = self._call("head", key, lambda: self._s3.head_object(Bucket=self.bucket, Key=full))
        sha = head.get("Metadata", {}).get("sha256")
        modified = head.get("LastModified")
        return BlobInfo(key=key, length=int(head["ContentLength"]), sha256=sha,
                        modified=modified.timestamp() if modified is not None else None)

    def exists(self, key: str) -> bool:
        try:
            self.stat(key)
        except BlobNotFoundError:
            return False
        return True

    def delete(self, key: str) -> None:
        full = self._full(key)
        self._call("delete", key, lambda: self._s3.delete_object(Bucket=self.bucket, Key=full))

    def list_keys(self, prefix: str = "") -> Iterator[str]:
        paginator = self._s3.get_paginator("list_objects_v2")
        keys: list[str] = []

        def collect() -> None:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
                keys.extend(item["Key"][len(self.prefix):] for item in page.get("Contents", []))

        self._call("list", prefix or "(all)", collect)
        return iter(sorted(keys))

    def check_ready(self) -> None:
        # HEAD on the bucket: one request, answers for endpoint, credentials and bucket.
        try:
            self._s3.head_bucket(Bucket=self.bucket)
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            raise BlobBackendError(f"S3 bucket {self.bucket!r} not usable: {code}".rstrip()
                                   ) from e
        except BotoCoreError as e:
            raise BlobBackendError(f"S3 endpoint not reachable: {e}") from e

    def presigned_url(self, key: str, expires_in: int = 3600) -> str | None:
        full = self._full(key)
        url: str = self._call("presign", key, lambda: self._s3.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": full}, ExpiresIn=expires_in,
        ))
        return url


class _BodyReader(io.RawIOBase):
    """A botocore StreamingBody as a raw binary stream, with errors translated."""

    def __init__(self, body: Any, store: S3BlobStore, key: str) -> None:
        self._body = body
        self._store = store
        self._key = key

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data: bytes = self._store._call("read", self._key, lambda: self._body.read(len(b)))
        n = len(data)
        b[:n] = data
        return n

    def close(self) -> None:
        try:
            self._body.close()
        finally:
            super().close()


__all__ = ["DEFAULT_PART_SIZE", "MIN_PART_SIZE", "BlobStoreError", "S3BlobStore"]
