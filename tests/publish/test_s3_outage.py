"""S3 refusing or timing out mid-upload and mid-publish (docs/architecture.md "Outages"),
against the moto server over HTTP behind a fault-injecting TCP proxy
(tests/support/faultproxy.py): a few failed requests are retried by botocore with backoff and
the blob or manifest lands whole; failures past the retries store nothing (no object under
the key) and publish nothing (no manifest row, the bucket's manifest unchanged), and the next
try after the endpoint is back succeeds. Every artifact the bucket's manifest names is in the
bucket.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from server.blobstore import BlobBackendError
from server.blobstore.s3 import MIN_PART_SIZE, S3BlobStore
from server.db import models as db
from server.publish.keys import KeyPaths
from server.publish.publisher import Publisher
from server.publish.signer import LocalKeySigner
from server.rollouts import service as ro
from server.rollouts.channels import create_channel
from tests.conftest import S3Bucket
from tests.publish.conftest import version_maker
from tests.support.clock import Clock
from tests.support.faultproxy import FaultProxy, fault_proxy
from tests.support.rollouts import start_rollout

MiB = 1024 * 1024


@pytest.fixture
def proxy(s3_bucket: S3Bucket) -> Iterator[FaultProxy]:
    with fault_proxy(s3_bucket.endpoint_url) as p:
        yield p


def store_via(proxy: FaultProxy, bucket: S3Bucket, *, attempts: int = 5) -> S3BlobStore:
    return S3BlobStore(bucket.bucket, endpoint_url=proxy.url, access_key=bucket.access_key,
                       secret_key=bucket.secret_key, part_size=MIN_PART_SIZE,
                       max_attempts=attempts, connect_timeout=1, read_timeout=0.5)


def chunks(total: int, *, at: int, then: Any) -> Iterator[bytes]:
    """`total` bytes in 1 MiB chunks; `then()` once `at` bytes were handed out."""
    sent = 0
    while sent < total:
        if sent == at:
            then()
        piece = hashlib.sha256(str(sent).encode()).digest() * (MiB // 32)
        sent += len(piece)
        yield piece


def expected_sha(total: int) -> str:
    return hashlib.sha256(b"".join(chunks(total, at=-1, then=None))).hexdigest()


def in_bucket(bucket: S3Bucket, key: str) -> bytes | None:
    try:
        return bytes(bucket.client().get_object(Bucket=bucket.bucket, Key=key)["Body"].read())
    except ClientError:
        return None


@pytest.mark.parametrize("how", ["reset", "stall"])
def test_s3_refusing_or_timing_out_mid_upload_is_retried_and_the_blob_lands_whole(
        proxy: FaultProxy, s3_bucket: S3Bucket, how: str) -> None:
    store = store_via(proxy, s3_bucket)
    total = 12 * MiB  # three parts: the faults hit the second
    info = store.put("v1/artifacts/big", chunks(total, at=6 * MiB,
                                                then=lambda: proxy.fail_next(2, how)))
    assert proxy.failed == 2 and proxy.pending == 0
    assert info.sha256 == expected_sha(total) and info.length == total
    data = in_bucket(s3_bucket, "v1/artifacts/big")
    assert data is not None and hashlib.sha256(data).hexdigest() == info.sha256


@pytest.mark.slow  # botocore's backoff between the timed-out tries: ~10 s
def test_s3_timeout_mid_upload_past_the_retries_stores_nothing(
        proxy: FaultProxy, s3_bucket: S3Bucket) -> None:
    store = store_via(proxy, s3_bucket, attempts=2)
    with pytest.raises(BlobBackendError, match="part upload"):
        store.put("v1/artifacts/big", chunks(12 * MiB, at=6 * MiB,
                                             then=lambda: proxy.fail_next(100, "stall")))
    proxy.clear()
    assert in_bucket(s3_bucket, "v1/artifacts/big") is None
    small = store.put("v1/artifacts/big", [b"whole"])  # the endpoint is back: it works
    assert in_bucket(s3_bucket, "v1/artifacts/big") == b"whole" and small.length == 5


@pytest.fixture
def s3_pub(proxy: FaultProxy, s3_bucket: S3Bucket, key_paths: KeyPaths,
           clock: Clock) -> Publisher:
    return Publisher(blob_store=store_via(proxy, s3_bucket, attempts=3),
                     signer=LocalKeySigner(key_paths.release_key_path), base_url="",
                     lifetime_seconds=86_400, clock=clock, content_keys=None)


def served_manifest(bucket: S3Bucket) -> dict[str, Any]:
    raw = in_bucket(bucket, "v1/channels/prod/manifest")
    assert raw is not None
    doc: dict[str, Any] = json.loads(base64.b64decode(json.loads(raw)["payload"]))
    return doc


def assert_names_only_blobs_in_the_bucket(bucket: S3Bucket) -> int:
    named = 0
    for entry in served_manifest(bucket)["models"].values():
        for release in entry["releases"]:
            for art in release["artifacts"].values() if isinstance(
                    release["artifacts"], dict) else release["artifacts"]:
                data = in_bucket(bucket, art["url"].lstrip("/"))
                assert data is not None, f"{art['url']} is named but not in the bucket"
                assert hashlib.sha256(data).hexdigest() == art["sha256"]
                named += 1
    return named


def serials(factory: sessionmaker[Session]) -> list[int]:
    with factory() as s:
        return list(s.scalars(select(db.SignedManifest.serial).order_by(
            db.SignedManifest.serial)))


def test_s3_timeout_mid_publish_is_retried_and_the_manifest_names_only_blobs_that_landed(
        factory: sessionmaker[Session], s3_pub: Publisher, proxy: FaultProxy,
        s3_bucket: S3Bucket) -> None:
    version_maker(factory, s3_pub.blob_store)("clf", "1.0", platforms=("android", "ios"))
    create_channel(factory, s3_pub, "prod", actor="test")
    proxy.fail_next(2, "stall")  # the publish's first two S3 requests time out
    start_rollout(factory, s3_pub, "prod", ro.RolloutSpec("clf", "1.0", 50), actor="test")
    assert proxy.failed == 2
    assert serials(factory) == [1, 2]
    assert assert_names_only_blobs_in_the_bucket(s3_bucket) == 2


@pytest.mark.slow  # every S3 call of the publish times out its tries: ~15 s
def test_s3_timeout_mid_publish_past_the_retries_publishes_nothing(
        factory: sessionmaker[Session], s3_pub: Publisher, proxy: FaultProxy,
        s3_bucket: S3Bucket) -> None:
    version_maker(factory, s3_pub.blob_store)("clf", "1.0", platforms=("android",))
    create_channel(factory, s3_pub, "prod", actor="test")
    before = in_bucket(s3_bucket, "v1/channels/prod/manifest")
    proxy.fail_next(100, "stall")
    with pytest.raises(BlobBackendError):
        start_rollout(factory, s3_pub, "prod", ro.RolloutSpec("clf", "1.0", 50),
                         actor="test")
    proxy.clear()
    assert serials(factory) == [1]  # no row for a manifest that is not stored
    with factory() as s:
        assert s.scalars(select(db.Release)).first() is None  # the change rolled back too
    assert in_bucket(s3_bucket, "v1/channels/prod/manifest") == before
    assert in_bucket(s3_bucket, "manifests/prod/2.json") is None
    start_rollout(factory, s3_pub, "prod", ro.RolloutSpec("clf", "1.0", 50), actor="test")
    assert serials(factory) == [1, 2]
    assert assert_names_only_blobs_in_the_bucket(s3_bucket) == 1
