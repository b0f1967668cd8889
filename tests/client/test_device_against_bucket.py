"""The bucket is the read API: a device whose base URL is the bucket — Debian's nginx serving
the local blob directory, the S3 server itself (moto over HTTP, anonymous reads of v1/ only),
or the caching proxy in front of S3 (docker-compose's device-cache) — installs, updates
through a patch, rolls back after a halt and follows a root rotation with a new release key,
step for step as a device pointed at the API (the `api` case, the baseline).

The release engineer's side is the real app (TestClient, `modelfleet keys` through the CLI);
the devices use the SDK's own HTTP transport over real sockets. Artifacts and patches are
stored under the keys of the layout before v1/ (tests/client/test_against_server.py
`add_version`), so publishing's copy to the read keys is exercised too.
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from client_sdk import DeviceProfile, ModelRuntime, Outcome, Transport, Updater, UpdaterConfig, Via
from modelfleet.cli import app as cli
from server.api import serving
from server.app import create_app
from server.auth import create_token
from server.blobstore import BlobStore
from server.db.migrate import upgrade
from server.publish import nginxconf
from server.publish.manifest_cache import MANIFEST_CACHE_SECONDS
from server.settings import Settings
from tests.client.onnx_models import scaled_model
from tests.client.test_against_server import AppTransport, add_version
from tests.support.nginx import require_nginx, running_nginx

X = np.ones((1, 4), dtype=np.float32)
BUCKETS = ["nginx", "s3", "proxy"]
BACKENDS = ["api", *BUCKETS]


@dataclass
class Fleet:
    client: TestClient  # the API, for the release engineer
    store: BlobStore
    data: Path
    base_url: str  # what devices are pointed at
    transport: Transport | None  # None: the SDK's own HTTP transport
    settle: Callable[[], None]  # wait until a publish is visible to devices

    def rotate(self, *args: str) -> None:
        result = CliRunner().invoke(cli, ["keys", "rotate", "--data-dir", str(self.data),
                                          *args])
        assert result.exit_code == 0, result.output
        self.settle()
        if self.transport is not None:
            # The API: the CLI re-signed in another process, so the app's manifest cache
            # learns of it by age (stale-while-revalidate: one poll starts the reload).
            time.sleep(MANIFEST_CACHE_SECONDS + 0.2)
            self.client.get("/v1/channels/prod/manifest")
            time.sleep(0.3)


def public_read_of_v1(bucket) -> None:  # type: ignore[no-untyped-def]
    """The bucket policy the README gives: anyone may GET v1/…, nothing else."""
    bucket.client().put_bucket_policy(Bucket=bucket.bucket, Policy=json.dumps({
        "Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
            "Resource": f"arn:aws:s3:::{bucket.bucket}/v1/*"}]}))


@pytest.fixture(params=BACKENDS)
def fleet(request: pytest.FixtureRequest, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[Fleet]:
    backend = request.param
    if backend in ("nginx", "proxy"):
        require_nginx()
    data = tmp_path / "srv"
    monkeypatch.setenv("MODELFLEET_DATA_DIR", str(data))
    monkeypatch.setenv("MODELFLEET_MANIFEST_LIFETIME_SECONDS", "86400")
    s3 = backend in ("s3", "proxy")
    if s3:
        bucket = request.getfixturevalue("s3_bucket")
        public_read_of_v1(bucket)
        for name, value in (("BLOB_STORE", "s3"), ("S3_BUCKET", bucket.bucket),
                            ("S3_ENDPOINT_URL", bucket.endpoint_url),
                            ("S3_ACCESS_KEY_ID", bucket.access_key),
                            ("S3_SECRET_ACCESS_KEY", bucket.secret_key)):
            monkeypatch.setenv(f"MODELFLEET_{name}", value)
    made = CliRunner().invoke(cli, ["keys", "init", "--data-dir", str(data), "--root-keys", "1",
                                    "--threshold", "1"])
    assert made.exit_code == 0, made.output
    settings = Settings()
    upgrade(settings.resolved_database_url)
    with TestClient(create_app(settings), base_url="http://testserver") as client:
        with client.app.state.session_factory() as s:
            _, secret = create_token(s, ["rollout"], name="ops")
            s.commit()
        client.headers["Authorization"] = f"Bearer {secret}"
        store = client.app.state.blob_store

        def fleet(base: str, transport: Transport | None = None,
                  settle: Callable[[], None] = lambda: None) -> Fleet:
            return Fleet(client, store, data, base, transport, settle)

        if backend == "api":
            yield fleet("http://testserver", AppTransport(client))
        elif backend == "nginx":
            objects = settings.resolved_blob_dir / "objects"
            with running_nginx(tmp_path / "nginx",
                               lambda listen: nginxconf.directory_server(objects, listen)) as url:
                yield fleet(url)
        elif backend == "s3":
            yield fleet(f"{bucket.endpoint_url}/{bucket.bucket}")
        else:
            fresh = nginxconf.MANIFEST_FRESH_SECONDS
            with running_nginx(tmp_path / "proxy", lambda listen: nginxconf.caching_proxy(
                    f"{bucket.endpoint_url}/{bucket.bucket}", listen, tmp_path / "cache")) as url:
                # nginx counts freshness in whole seconds: 1 s fresh is up to 2 s.
                yield fleet(url, settle=lambda: time.sleep(fresh + 1.2))


def test_device_updates_patches_rolls_back_and_follows_a_root_rotation(
        fleet: Fleet, tmp_path: Path) -> None:
    client, store = fleet.client, fleet.store
    v1 = scaled_model(1.0, padding=20_000)
    v2 = scaled_model(2.0, padding=20_000, tweak=50)
    assert client.post("/v1/channels", json={"name": "prod"}).status_code == 201
    add_version(client, store, "clf", "1.0", v1)  # type: ignore[arg-type]
    assert client.post("/v1/channels/prod/rollouts", json={
        "model": "clf", "version": "1.0", "percentage": 100}).status_code == 201
    fleet.settle()

    runtime = ModelRuntime(tmp_path / "device", shadow_budget=None)
    up = Updater(UpdaterConfig(
        base_url=fleet.base_url, channel="prod",
        pinned_root=client.get("/v1/root/1.json").content,
        device=DeviceProfile("edge-1", "onnx", arch="x86_64"), data_dir=tmp_path / "device",
        transport=fleet.transport, runtime=runtime, formats=["onnx"]))
    first = up.check_once()
    assert first.outcome is Outcome.UPDATED, first
    assert (first.models[0].via, first.models[0].nbytes) == (Via.FULL, len(v1))
    assert runtime.predict("clf", {"x": X}).version == "1.0"
    assert up.check_once().outcome is Outcome.UP_TO_DATE

    add_version(client, store, "clf", "2.0", v2, patch_from=v1)  # type: ignore[arg-type]
    r = client.post("/v1/channels/prod/rollouts",
                    json={"model": "clf", "version": "2.0", "percentage": 100})
    assert r.status_code == 201, r.text
    fleet.settle()
    second = up.check_once()
    assert second.outcome is Outcome.UPDATED and second.models[0].version == "2.0", second
    assert second.models[0].via is Via.PATCH and 0 < second.models[0].nbytes < len(v2) / 4
    assert runtime.predict("clf", {"x": X}).version == "2.0"

    assert client.post(f"/v1/rollouts/{r.json()['id']}/halt").status_code == 200
    fleet.settle()
    third = up.check_once()
    assert third.outcome is Outcome.ROLLED_BACK and third.models[0].version == "1.0", third
    assert (third.models[0].via, third.models[0].nbytes) == (Via.HELD, 0)
    assert runtime.predict("clf", {"x": X}).version == "1.0"

    # Root v2 with a new release key: every channel is re-signed with it at once; the device
    # must take root v2 (signed by v1's root key) before it accepts the new signatures.
    fleet.rotate("--rotate-release")
    fourth = up.check_once()
    assert fourth.outcome is Outcome.UP_TO_DATE, fourth
    assert up.trusted.root.version == 2
    assert runtime.predict("clf", {"x": X}).version == "1.0"


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


@pytest.mark.parametrize("fleet", BUCKETS, indirect=True)
def test_the_bucket_answers_with_the_apis_bytes_content_types_and_cache_headers(
        fleet: Fleet) -> None:
    client = fleet.client
    assert client.post("/v1/channels", json={"name": "prod"}).status_code == 201
    model = scaled_model(1.0)
    add_version(client, fleet.store, "clf", "1.0", model)  # type: ignore[arg-type]
    assert client.post("/v1/channels/prod/rollouts", json={
        "model": "clf", "version": "1.0", "percentage": 100}).status_code == 201
    fleet.settle()
    sha = hashlib.sha256(model).hexdigest()
    for path in ("v1/channels/prod/manifest", "v1/root/1.json", f"v1/artifacts/{sha}"):
        api = client.get("/" + path, follow_redirects=False)
        if api.status_code == 302:  # the S3 store: the API redirects to a presigned URL
            api_status, _, api_body = _get(api.headers["location"])
            # …to the blob's own key; what the route sends when it streams the file itself:
            api_headers = {"content-type": "application/octet-stream",
                           "cache-control": serving.IMMUTABLE}
        else:
            api_status, api_headers, api_body = api.status_code, dict(api.headers), api.content
        status, headers, body = _get(f"{fleet.base_url}/{path}")
        assert (status, body) == (200, api_body) and api_status == 200, path
        for name in ("content-type", "cache-control"):
            assert headers[name] == api_headers[name], (path, name)
        again = _get(f"{fleet.base_url}/{path}", {"If-None-Match": headers["etag"]})
        assert again[0] == 304 and again[2] == b"", path
    assert _get(f"{fleet.base_url}/v1/root/2.json")[0] == 404  # how devices see "no rotation"
    assert _get(f"{fleet.base_url}/v1/channels/nope/manifest")[0] == 404


@pytest.mark.parametrize("fleet", BUCKETS, indirect=True)
def test_bucket_server_never_serves_uploaded_sources_or_the_manifest_archive(
        fleet: Fleet) -> None:
    """Uploaded models (sources/…) and every signed serial (manifests/…) sit in the same
    store; whatever serves devices must answer only the v1/ read paths."""
    fleet.store.put("sources/clf/1.0/abc/model", [b"proprietary weights"])
    assert fleet.client.post("/v1/channels", json={"name": "prod"}).status_code == 201
    fleet.settle()
    source = "sources/clf/1.0/abc/model"
    for path in (source, "manifests/prod/1.json", f"v1/../{source}",
                 f"v1/channels/prod/../../{source}", f"v1/artifacts/%2e%2e/{source}", "v1/root/"):
        status, _, body = _get(f"{fleet.base_url}/{path}")
        assert status in (403, 404) and b"proprietary" not in body, (path, status)
