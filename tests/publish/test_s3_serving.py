"""On the S3 blob store (moto over real HTTP): manifests are stored in the bucket as signed,
and artifact GETs redirect to a presigned URL that serves the exact bytes."""

from __future__ import annotations

import hashlib
import time

import httpx
from fastapi.testclient import TestClient

import manifests
from server.app import create_app
from server.auth import create_token
from server.blobstore.keys import channel_manifest_key
from server.blobstore.s3 import S3BlobStore
from server.db.migrate import upgrade
from server.settings import Settings
from tests.publish.conftest import version_maker
from tests.support.server_keys import init_test_keys


def test_artifacts_redirect_to_presigned_s3_urls_and_manifest_bytes_sit_in_the_bucket(
        tmp_path, s3_bucket):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade(url)
    data = tmp_path / "data"
    init_test_keys(data)
    store = S3BlobStore(s3_bucket.bucket, endpoint_url=s3_bucket.endpoint_url,
                        access_key="testing", secret_key="testing")
    settings = Settings(data_dir=data, database_url=url, public_base_url="https://api.example")
    with TestClient(create_app(settings, blob_store=store)) as client:
        with client.app.state.session_factory() as s:
            _, secret = create_token(s, ["rollout"])
            s.commit()
        h = {"Authorization": f"Bearer {secret}"}
        client.post("/v1/channels", json={"name": "prod"}, headers=h)
        shas = version_maker(client.app.state.session_factory, store)("clf", "1.0",
                                                                     platforms=("ios",))
        r = client.post("/v1/channels/prod/rollouts", headers=h,
                        json={"model": "clf", "version": "1.0", "percentage": 25})
        assert r.status_code == 201, r.text
        served = client.get("/v1/channels/prod/manifest").content
        root = manifests.load_trusted_root(client.get("/v1/root/1.json").content)
        m = manifests.verify_manifest(root, served, now=int(time.time()), channel="prod",
                                      trusted=None)
        art = m.models["clf"].releases[0].artifacts[0]
        assert art.url == f"https://api.example/v1/artifacts/{shas['ios']}"
        # a CDN or the bucket itself can serve the current manifest, byte for byte
        obj = s3_bucket.client().get_object(Bucket=s3_bucket.bucket,
                                            Key=channel_manifest_key("prod"))
        assert obj["Body"].read() == served
        r = client.get(f"/v1/artifacts/{art.sha256}", follow_redirects=False)
        assert r.status_code == 302
        location = r.headers["location"]
        assert location.startswith(s3_bucket.endpoint_url)
        direct = httpx.get(location)
        assert direct.status_code == 200
        assert hashlib.sha256(direct.content).hexdigest() == art.sha256
        ranged = httpx.get(location, headers={"Range": "bytes=0-9"})
        assert ranged.status_code == 206 and ranged.content == direct.content[:10]
