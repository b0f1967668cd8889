"""The publishing HTTP API end to end: keys → roots served, channels, rollout changes each
producing a higher serial, manifest ETag/304, artifact Range, errors, preview."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient

import manifests
from server.app import create_app
from server.auth import create_token
from server.blobstore import LocalBlobStore
from server.db import models as db
from server.db.migrate import upgrade
from server.publish.keys import KeyPaths, rotate_root
from server.settings import Settings
from server.wiring import manifest_base_url
from tests.publish.conftest import version_maker
from tests.support.server_keys import init_test_keys


@pytest.fixture
def settings(database_url, tmp_path):
    upgrade(database_url)
    data = tmp_path / "data"
    init_test_keys(data, root_keys=2)
    return Settings(env="development", data_dir=data, database_url=database_url,
                    public_base_url="http://testserver", manifest_lifetime_seconds=86_400)


@pytest.fixture
def client(settings):
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture
def headers(client):
    with client.app.state.session_factory() as s:
        _, secret = create_token(s, ["rollout"], name="ops")
        s.commit()
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def make_version(client, settings):
    return version_maker(client.app.state.session_factory,
                         LocalBlobStore(settings.resolved_blob_dir))


def verified(client, root, etag=None):
    r = client.get("/v1/channels/prod/manifest")
    assert r.status_code == 200
    return manifests.verify_manifest(root, r.content, now=int(time.time()), channel="prod",
                                     trusted=None), r


def test_keys_init_root_is_served_and_rotation_keeps_old_versions(client, settings):
    paths = KeyPaths.for_data_dir(settings.data_dir)
    r = client.get("/v1/root/1.json")
    assert r.status_code == 200
    assert r.content == paths.root_path(1).read_bytes()
    assert "immutable" in r.headers["cache-control"]
    assert client.get("/v1/root/2.json").status_code == 404
    rotate_root(paths, now=int(time.time()), rotate_release=True)
    with TestClient(create_app(settings)) as c2:  # restart imports the new root
        v1 = manifests.load_trusted_root(c2.get("/v1/root/1.json").content)
        v2 = manifests.verify_root_update(v1, c2.get("/v1/root/2.json").content)
        assert c2.get("/v1/root").json() == {"latest_version": 2}
        assert v2.version == 2


def test_rollout_lifecycle_each_change_bumps_the_serial(client, headers, make_version):
    root = manifests.load_trusted_root(client.get("/v1/root/1.json").content)
    assert client.post("/v1/channels", json={"name": "prod"}, headers=headers).status_code == 201
    m, r = verified(client, root)
    assert m.serial == 1
    assert r.headers["etag"].startswith('"') and "max-age" in r.headers["cache-control"]
    etag = r.headers["etag"]
    head = client.head("/v1/channels/prod/manifest")
    assert head.status_code == 200 and head.headers["etag"] == etag and head.content == b""
    assert client.get("/v1/channels/prod/manifest",
                      headers={"If-None-Match": etag}).status_code == 304
    make_version("clf", "1.0")
    r = client.post("/v1/channels/prod/rollouts", headers=headers, json={
        "model": "clf", "version": "1.0", "percentage": 0.5, "mode": "active",
        "filters": {"platforms": ["android"]}})
    assert r.status_code == 201, r.text
    rollout = r.json()
    assert (rollout["share_ppm"], rollout["serial"]) == (5_000, 2)
    m, r = verified(client, root)  # the change is visible at once through this process
    assert m.serial == 2 and r.headers["etag"] != etag
    assert client.get("/v1/channels/prod/manifest",
                      headers={"If-None-Match": etag}).status_code == 200
    r = client.patch(f"/v1/rollouts/{rollout['id']}", json={"percentage": 50}, headers=headers)
    assert (r.status_code, r.json()["serial"], r.json()["share_ppm"]) == (200, 3, 500_000)
    r = client.post(f"/v1/rollouts/{rollout['id']}/halt", headers=headers)
    assert (r.status_code, r.json()["serial"], r.json()["state"]) == (200, 4, "halted")
    m, _ = verified(client, root)
    assert m.serial == 4 and m.models == {}
    r = client.patch(f"/v1/rollouts/{rollout['id']}", json={"percentage": 60}, headers=headers)
    assert r.status_code == 409 and "halted" in r.json()["detail"]
    audit = client.get("/v1/audit", headers=headers).json()["events"]
    assert [e["action"] for e in audit][:3] == ["rollout.halt", "rollout.ramp", "rollout.start"]


def test_bad_rollout_requests_get_clear_4xx(client, headers, make_version):
    client.post("/v1/channels", json={"name": "prod"}, headers=headers)
    make_version("clf", "1.0")
    make_version("clf", "2.0", state="compiling")
    post = lambda body: client.post("/v1/channels/prod/rollouts", headers=headers,  # noqa: E731
                                    json={"model": "clf", "version": "1.0", **body})
    r = post({"percentage": 101})
    assert r.status_code == 422 and "outside 0–100" in r.json()["detail"]
    r = post({"percentage": -1})
    assert r.status_code == 422
    r = post({"percentage": 0.00001})
    assert r.status_code == 422 and "finer" in r.json()["detail"]
    r = post({"percentage": 5, "filters": {"platforms": ["windows"]}})
    assert r.status_code == 422 and "unknown platform" in r.json()["detail"]
    r = post({"percentage": 5, "version": "2.0"})
    assert r.status_code == 409 and r.json()["code"] == "version_not_ready"
    r = client.post("/v1/channels/Bad Name/rollouts", headers=headers,
                    json={"model": "clf", "version": "1.0", "percentage": 5})
    assert r.status_code == 422 and "channel name" in r.json()["detail"]
    r = client.post("/v1/channels/beta/rollouts", headers=headers,
                    json={"model": "clf", "version": "2.0", "percentage": 5})
    assert r.status_code == 409  # not ready: refused before the channel is created
    assert client.get("/v1/channels/beta/manifest").status_code == 404
    assert client.post("/v1/channels/prod/rollouts",
                       json={"model": "clf", "version": "1.0", "percentage": 5}
                       ).status_code == 401
    with client.app.state.session_factory() as s:
        _, publish_only = create_token(s, ["publish"])
        s.commit()
    assert client.post("/v1/channels/prod/rollouts",
                       headers={"Authorization": f"Bearer {publish_only}"},
                       json={"model": "clf", "version": "1.0", "percentage": 5}
                       ).status_code == 403
    assert client.get("/v1/channels/prod/manifest").status_code == 200
    assert client.get("/v1/channels/nope/manifest").status_code == 404


def test_first_rollout_on_a_new_channel_creates_it(client, headers, make_version):
    make_version("clf", "1.0")
    r = client.post("/v1/channels/beta/rollouts", headers=headers,
                    json={"model": "clf", "version": "1.0", "percentage": 10, "mode": "active",
                          "filters": {}})
    assert r.status_code == 201, r.text
    assert r.json()["serial"] == 1  # the new channel's first manifest already offers it
    root = manifests.load_trusted_root(client.get("/v1/root/1.json").content)
    m = manifests.verify_manifest(root, client.get("/v1/channels/beta/manifest").content,
                                  now=int(time.time()), channel="beta", trusted=None)
    assert m.models["clf"].releases[0].rollout.share_ppm == 100_000
    assert client.post("/v1/channels", json={"name": "beta"}, headers=headers).status_code == 409


def test_artifact_urls_in_the_manifest_serve_bytes_with_range(client, headers, make_version):
    client.post("/v1/channels", json={"name": "prod"}, headers=headers)
    shas = make_version("clf", "1.0", platforms=("android",))
    client.post("/v1/channels/prod/rollouts", headers=headers,
                json={"model": "clf", "version": "1.0", "percentage": 100})
    root = manifests.load_trusted_root(client.get("/v1/root/1.json").content)
    m, _ = verified(client, root)
    art = m.models["clf"].releases[0].artifacts[0]
    assert art.sha256 == shas["android"]
    path = urlsplit(art.url).path
    full = client.get(path)
    assert full.status_code == 200 and len(full.content) == art.length
    assert full.headers["accept-ranges"] == "bytes"
    part = client.get(path, headers={"Range": "bytes=10-19"})
    assert part.status_code == 206
    assert part.content == full.content[10:20]
    assert part.headers["content-range"] == f"bytes 10-19/{art.length}"
    tail = client.get(path, headers={"Range": "bytes=-5"})
    assert tail.status_code == 206 and tail.content == full.content[-5:]
    r = client.get(path, headers={"Range": f"bytes={art.length}-"})
    assert r.status_code == 416 and r.headers["content-range"] == f"bytes */{art.length}"
    assert client.head(path).headers["content-length"] == str(art.length)
    assert client.get("/v1/artifacts/" + "0" * 64).status_code == 404
    assert client.get("/v1/artifacts/not-a-sha").status_code == 422


def test_preview_says_which_devices_a_rollout_reaches(client, headers, make_version):
    client.post("/v1/channels", json={"name": "prod"}, headers=headers)
    make_version("clf", "1.0", platforms=("android",))
    devices = [{"device_id": "iphone", "platform": "ios"}]
    devices += [{"device_id": f"d{i}", "platform": "android"} for i in range(2000)]
    r = client.post("/v1/channels/prod/preview", headers=headers, json={
        "model": "clf", "version": "1.0", "percentage": 10, "devices": devices})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["total"] == 2001 and 150 < body["included"] < 250
    assert "iphone" in body["excluded_device_ids"]
    # the preview is exact: the started rollout picks the same devices
    rid = client.post("/v1/channels/prod/rollouts", headers=headers, json={
        "model": "clf", "version": "1.0", "percentage": 10}).json()["id"]
    root = manifests.load_trusted_root(client.get("/v1/root/1.json").content)
    m, _ = verified(client, root)
    reached = [d["device_id"] for d in devices if manifests.select_release(
        m, "clf", manifests.DeviceProfile(d["device_id"], d["platform"]))]
    assert sorted(reached) == sorted(body["included_device_ids"])
    outsider = next(d for d in body["excluded_device_ids"] if d != "iphone")
    r = client.post(f"/v1/rollouts/{rid}/pin", headers=headers, json={"device_ids": [outsider]})
    assert r.status_code == 200 and r.json()["filters"]["device_allow"] == [outsider]
    r = client.post("/v1/channels/prod/preview", headers=headers,
                    json={"rollout_id": rid, "devices": devices})
    assert r.json()["included"] == body["included"] + 1


def test_urls_are_relative_unless_a_public_base_url_is_set(tmp_path):
    assert manifest_base_url(Settings(data_dir=tmp_path)) == ""
    assert manifest_base_url(Settings(data_dir=tmp_path, public_base_url="https://cdn.x")
                             ) == "https://cdn.x"


def test_preview_defaults_to_the_devices_the_server_has_seen(client, headers, make_version):
    make_version("clf", "1.0", platforms=("android",))
    client.post("/v1/channels", json={"name": "prod"}, headers=headers)
    with client.app.state.session_factory() as s:
        s.add_all([db.Device(id=f"seen-{i}", profile={"platform": "android"})
                   for i in range(300)])
        s.add(db.Device(id="old-iphone", profile={"platform": "ios", "os_version": "17.1"}))
        s.commit()
    r = client.post("/v1/channels/prod/preview", headers=headers, json={
        "model": "clf", "version": "1.0", "percentage": 100,
        "filters": {"platforms": ["android"]}})
    assert r.status_code == 200, r.text
    assert (r.json()["total"], r.json()["included"]) == (301, 300)
    assert r.json()["excluded_device_ids"] == ["old-iphone"]
