"""One contract, two stores: the local directory and S3 over real HTTP (moto server).

Every case runs against both; each failure case also checks that nothing became visible and
that an older blob under the same key is untouched.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.blobstore import (
    BlobBackendError,
    BlobDigestMismatchError,
    BlobNotFoundError,
    BlobStore,
    BlobStoreError,
    BlobTooLargeError,
    InvalidBlobKeyError,
    LocalBlobStore,
)
from server.blobstore.s3 import MIN_PART_SIZE, S3BlobStore

PART = MIN_PART_SIZE  # S3 store uses the smallest legal part so multipart is exercised cheaply


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    if request.param == "local":
        return LocalBlobStore(tmp_path / "blobs")
    bucket = request.getfixturevalue("s3_bucket")
    return S3BlobStore(
        bucket.bucket,
        endpoint_url=bucket.endpoint_url,
        access_key=bucket.access_key,
        secret_key=bucket.secret_key,
        region=bucket.region,
        prefix="mf/",
        part_size=PART,
    )


def test_a_usable_store_is_ready(store: BlobStore) -> None:
    store.check_ready()  # GET /readyz calls this: it must pass on every working store


def test_readiness_names_a_missing_bucket_or_a_removed_blob_directory(
        s3_bucket, tmp_path: Path) -> None:
    import shutil

    missing = S3BlobStore(s3_bucket.bucket + "-gone", endpoint_url=s3_bucket.endpoint_url,
                          access_key=s3_bucket.access_key, secret_key=s3_bucket.secret_key,
                          region=s3_bucket.region)
    with pytest.raises(BlobBackendError, match="-gone"):
        missing.check_ready()
    local = LocalBlobStore(tmp_path / "blobs")
    shutil.rmtree(tmp_path / "blobs")
    with pytest.raises(BlobBackendError, match="missing"):
        local.check_ready()


def read_all(store: BlobStore, key: str) -> bytes:
    with store.open(key) as f:
        return f.read()


def chunks_of(data: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


class SourceBroke(Exception):
    pass


def failing_source(data: bytes, fail_after: int) -> Iterator[bytes]:
    sent = 0
    for chunk in chunks_of(data):
        if sent >= fail_after:
            raise SourceBroke("client went away")
        sent += len(chunk)
        yield chunk


def test_put_returns_sha256_and_length_and_round_trips(store: BlobStore) -> None:
    data = os.urandom(300_000)
    info = store.put("sources/a/model.onnx", chunks_of(data))
    assert info.sha256 == hashlib.sha256(data).hexdigest()
    assert info.length == len(data)
    assert read_all(store, "sources/a/model.onnx") == data
    assert store.stat("sources/a/model.onnx").length == len(data)
    assert store.exists("sources/a/model.onnx")


def test_stat_says_when_the_blob_was_written(store: BlobStore) -> None:
    # The source GC measures its grace period from this: a blob stamped in the past would
    # lose an upload in flight, one without a time is never collected.
    before = time.time()
    store.put("sources/a/model.onnx", [b"x" * 100])
    after = time.time()
    modified = store.stat("sources/a/model.onnx").modified
    assert modified is not None
    assert before - 1.5 <= modified <= after + 1.5  # S3 stamps whole seconds


def test_put_accepts_a_binary_file(store: BlobStore) -> None:
    data = b"x" * 10_000
    info = store.put("f", io.BytesIO(data))
    assert (info.length, read_all(store, "f")) == (len(data), data)


def test_empty_blob(store: BlobStore) -> None:
    info = store.put("empty", iter([]))
    assert info.length == 0 and info.sha256 == hashlib.sha256(b"").hexdigest()
    assert read_all(store, "empty") == b""
    assert list(store.iter_range("empty")) == []


def test_blob_larger_than_one_part_streams_in_parts(store: BlobStore) -> None:
    data = os.urandom(2 * PART + 12345)
    info = store.put("big/model.bin", chunks_of(data, 1024 * 1024))
    assert info.sha256 == hashlib.sha256(data).hexdigest()
    assert info.length == len(data)
    got = b"".join(store.iter_range("big/model.bin"))
    assert got == data


def test_put_replaces_an_existing_blob(store: BlobStore) -> None:
    store.put("k", [b"old"])
    store.put("k", [b"new content"])
    assert read_all(store, "k") == b"new content"


def http_headers(store: BlobStore, key: str) -> dict[str, str] | None:
    """The Content-Type and Cache-Control a GET of the blob answers with where the backend
    serves it itself (S3); None for a local directory (its HTTP server sets them by path)."""
    url = store.presigned_url(key)
    if url is None:
        return None
    with urllib.request.urlopen(url) as r:
        return {"type": r.headers["Content-Type"], "cache": r.headers["Cache-Control"]}


@pytest.mark.parametrize("size", [100, 2 * PART + 1])  # one PutObject, and multipart
def test_put_records_the_content_type_and_cache_control_served_with_the_blob(
        store: BlobStore, size: int) -> None:
    data = os.urandom(size)
    store.put("v1/patches/x", chunks_of(data, 1024 * 1024), content_type="application/json",
              cache_control="public, max-age=60, must-revalidate")
    assert read_all(store, "v1/patches/x") == data
    headers = http_headers(store, "v1/patches/x")
    if headers is not None:
        assert headers == {"type": "application/json",
                           "cache": "public, max-age=60, must-revalidate"}
    store.put("v1/patches/x", [b"plain"])  # a put without them: the defaults, no stale header
    headers = http_headers(store, "v1/patches/x")
    if headers is not None:
        assert headers == {"type": "application/octet-stream", "cache": None}


def test_local_replacement_always_changes_the_mtime_validator(tmp_path: Path) -> None:
    """nginx's ETag is mtime plus length: two manifests of one length published within one
    second must still differ, or a device is told 304 and keeps the older one."""
    store = LocalBlobStore(tmp_path / "blobs")
    path = tmp_path / "blobs" / "objects" / "v1" / "channels" / "prod" / "manifest"
    seen = set()
    for body in (b"serial-1", b"serial-2", b"serial-3"):  # same length, same second
        store.put("v1/channels/prod/manifest", [body])
        st = path.stat()
        seen.add((int(st.st_mtime), st.st_size))
    assert len(seen) == 3


@pytest.mark.parametrize("size", [1000, 2 * PART + 1])
def test_oversize_put_stores_nothing_and_keeps_old_blob(store: BlobStore, size: int) -> None:
    store.put("k", [b"old"])
    with pytest.raises(BlobTooLargeError):
        store.put("k", chunks_of(b"z" * size, 1024 * 1024), max_bytes=size - 1)
    assert read_all(store, "k") == b"old"
    with pytest.raises(BlobTooLargeError):
        store.put("fresh", chunks_of(b"z" * size, 1024 * 1024), max_bytes=size - 1)
    assert not store.exists("fresh")


def test_exactly_max_bytes_is_accepted(store: BlobStore) -> None:
    assert store.put("k", [b"abcd"], max_bytes=4).length == 4


@pytest.mark.parametrize("size", [5000, PART + 100])
def test_digest_mismatch_stores_nothing(store: BlobStore, size: int) -> None:
    data = os.urandom(size)
    with pytest.raises(BlobDigestMismatchError):
        store.put("k", chunks_of(data), expected_sha256="0" * 64)
    assert not store.exists("k")
    ok = store.put("k", chunks_of(data), expected_sha256=hashlib.sha256(data).hexdigest())
    assert ok.length == size


@pytest.mark.parametrize("fail_after", [0, 100_000, PART + 100_000])
def test_source_failure_midway_stores_nothing(store: BlobStore, fail_after: int) -> None:
    store.put("k", [b"old"])
    data = os.urandom(PART + 300_000)
    with pytest.raises(SourceBroke):
        store.put("k", failing_source(data, fail_after))
    assert read_all(store, "k") == b"old"
    with pytest.raises(SourceBroke):
        store.put("other", failing_source(data, fail_after))
    assert not store.exists("other")


def test_blob_is_invisible_until_put_finishes(store: BlobStore) -> None:
    seen: list[bool] = []

    def source() -> Iterator[bytes]:
        yield b"a" * 1000
        seen.append(store.exists("pending"))
        yield b"b" * 1000

    store.put("pending", source())
    assert seen == [False]
    assert store.stat("pending").length == 2000


def test_ranges(store: BlobStore) -> None:
    data = bytes(range(256)) * 40
    store.put("r", [data])
    assert b"".join(store.iter_range("r", 0, 10)) == data[:10]
    assert b"".join(store.iter_range("r", 100)) == data[100:]
    assert b"".join(store.iter_range("r", 5000, 5001)) == data[5000:5001]
    assert b"".join(store.iter_range("r", 7, 7)) == b""
    assert b"".join(store.iter_range("r", 0, len(data), chunk_size=333)) == data


@pytest.mark.parametrize(("start", "end"), [(-1, 5), (10, 5), (0, 10_241)])
def test_invalid_range_is_refused(store: BlobStore, start: int, end: int) -> None:
    store.put("r", [b"x" * 10_240])
    with pytest.raises(BlobStoreError):
        list(store.iter_range("r", start, end))


def test_missing_blob_raises_not_found_everywhere(store: BlobStore) -> None:
    with pytest.raises(BlobNotFoundError):
        store.open("nope")
    with pytest.raises(BlobNotFoundError):
        store.stat("nope")
    with pytest.raises(BlobNotFoundError):
        store.iter_range("nope")
    assert not store.exists("nope")


def test_delete_is_idempotent(store: BlobStore) -> None:
    store.put("d", [b"1"])
    store.delete("d")
    store.delete("d")
    assert not store.exists("d")


def test_list_keys_by_prefix_sorted(store: BlobStore) -> None:
    for key in ["a/2", "a/1", "b/1", "a/sub/3"]:
        store.put(key, [b"."])
    assert list(store.list_keys("a/")) == ["a/1", "a/2", "a/sub/3"]
    assert list(store.list_keys()) == ["a/1", "a/2", "a/sub/3", "b/1"]


@pytest.mark.parametrize(
    "key", ["", "../x", "a/../../x", "/abs", "a//b", "a/./b", "a\\b", "sp ace", "trail/", "\x00"]
)
def test_unsafe_keys_are_refused(store: BlobStore, key: str) -> None:
    with pytest.raises(InvalidBlobKeyError):
        store.put(key, [b"x"])
    with pytest.raises(InvalidBlobKeyError):
        store.open(key)


def test_presigned_url_serves_the_blob_or_is_absent(store: BlobStore) -> None:
    store.put("p/model.bin", [b"presigned bytes"])
    url = store.presigned_url("p/model.bin", expires_in=60)
    if isinstance(store, LocalBlobStore):
        assert url is None  # the API serves local blobs itself
        return
    assert url is not None
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.read() == b"presigned bytes"


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.binary(max_size=5000), cut=st.integers(0, 5000), span=st.integers(0, 5000))
def test_any_range_equals_the_slice(store: BlobStore, data: bytes, cut: int, span: int) -> None:
    store.put("h", chunks_of(data, 777))
    start = min(cut, len(data))
    end = min(start + span, len(data))
    assert b"".join(store.iter_range("h", start, end, chunk_size=100)) == data[start:end]


# --- S3-specific: the mechanics behind the contract --------------------------------------


def test_s3_large_blob_is_a_completed_multipart_upload(s3_bucket) -> None:  # type: ignore[no-untyped-def]
    store = S3BlobStore(s3_bucket.bucket, endpoint_url=s3_bucket.endpoint_url,
                        access_key="testing", secret_key="testing", part_size=PART)
    store.put("m", chunks_of(os.urandom(2 * PART + 1), 1024 * 1024))
    etag = s3_bucket.client().head_object(Bucket=s3_bucket.bucket, Key="m")["ETag"]
    assert etag.strip('"').endswith("-3")  # three parts


def test_s3_failed_multipart_upload_is_aborted(s3_bucket) -> None:  # type: ignore[no-untyped-def]
    store = S3BlobStore(s3_bucket.bucket, endpoint_url=s3_bucket.endpoint_url,
                        access_key="testing", secret_key="testing", part_size=PART)
    with pytest.raises(BlobTooLargeError):
        store.put("m", chunks_of(b"q" * (2 * PART), 1024 * 1024), max_bytes=PART + 10)
    pending = s3_bucket.client().list_multipart_uploads(Bucket=s3_bucket.bucket)
    assert pending.get("Uploads", []) == []


def test_s3_unreachable_endpoint_is_a_plain_backend_error() -> None:
    from server.blobstore import BlobBackendError

    # Two attempts, not the default five: the error is the point here, not botocore's backoff
    # (which alone took ~20 s of the suite).
    store = S3BlobStore("b", endpoint_url="http://127.0.0.1:9", access_key="x", secret_key="y",
                        max_attempts=2)
    with pytest.raises(BlobBackendError, match="S3 head"):
        store.stat("k")


def test_s3_missing_bucket_is_a_plain_backend_error(s3_server: str) -> None:
    from server.blobstore import BlobBackendError

    store = S3BlobStore("no-such-bucket-here", endpoint_url=s3_server,
                        access_key="testing", secret_key="testing")
    with pytest.raises(BlobBackendError, match="NoSuchBucket"):
        store.put("k", [b"x"])


# --- Streaming: a blob never sits in memory -------------------------------------------------


class RecordingS3Client:
    """The real boto3 client, with the size of every request body recorded."""

    def __init__(self, real) -> None:  # type: ignore[no-untyped-def]
        self._real = real
        self.bodies: list[int] = []

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        attr = getattr(self._real, name)
        if name not in ("put_object", "upload_part"):
            return attr

        def call(**kw):  # type: ignore[no-untyped-def]
            self.bodies.append(len(kw["Body"]))
            return attr(**kw)

        return call


def test_s3_put_holds_at_most_one_part_and_reads_the_source_lazily(s3_bucket) -> None:  # type: ignore[no-untyped-def]
    client = RecordingS3Client(s3_bucket.client())
    store = S3BlobStore(s3_bucket.bucket, part_size=PART, client=client)
    produced = 0
    ahead: list[int] = []

    def source() -> Iterator[bytes]:
        nonlocal produced
        for _ in range(4 * PART // (256 * 1024)):
            ahead.append(produced - sum(client.bodies))  # bytes read but not yet sent
            produced += 256 * 1024
            yield b"\x5a" * (256 * 1024)

    info = store.put("lazy", source())
    assert info.length == 4 * PART
    assert client.bodies == [PART] * 4
    assert max(ahead) <= PART  # never more than one part buffered


def test_local_put_streams_in_constant_memory(tmp_path: Path) -> None:
    # Measured in a fresh interpreter: tracemalloc counts every thread of the process, and
    # threads other tests leave running (job workers, shadow workers) made the peak noisy.
    script = """
import sys, tracemalloc
from pathlib import Path
from server.blobstore.local import LocalBlobStore
store = LocalBlobStore(Path(sys.argv[1]))
chunk = b"\\x00" * (1024 * 1024)
tracemalloc.start()
store.put("big", (chunk for _ in range(64)))
_, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
print(store.stat("big").length, peak)
"""
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "blobs")],
                         capture_output=True, text=True, check=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    length, peak = (int(v) for v in out.stdout.split())
    assert length == 64 * 1024 * 1024
    assert peak < 4 * 1024 * 1024, peak
