"""One API call, one signed serial: every rollout change — a start that creates its channel
too, a PATCH that promotes and ramps at once — is signed exactly once, and the publisher
writes the devices' read path from the bytes it signed, never reading them back.

Counted against the real app: the release key's signatures (the wired `LocalKeySigner`,
wrapped to count its calls), the `signed_manifests` rows and the per-serial blobs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from server.app import create_app
from server.auth import create_token
from server.blobstore import LocalBlobStore
from server.db import models as db
from server.db.migrate import upgrade
from server.publish.signer import Signer
from server.settings import Settings
from tests.publish.conftest import version_maker
from tests.support.server_keys import init_test_keys


class CountingSigner:
    """The wired release signer, counting the signatures it makes."""

    def __init__(self, signer: Signer) -> None:
        self.signer = signer
        self.signatures = 0

    def keyid(self) -> str:
        return self.signer.keyid()

    def sign(self, message: bytes) -> bytes:
        self.signatures += 1
        return self.signer.sign(message)


class ReadRecordingStore(LocalBlobStore):
    """The app's own blob directory, recording every key read."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: list[str] = []

    def open(self, key: str) -> BinaryIO:
        self.reads.append(key)
        return super().open(key)

    def iter_range(self, key: str, *args: Any, **kwargs: Any) -> Iterator[bytes]:
        self.reads.append(key)
        return super().iter_range(key, *args, **kwargs)


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str], CountingSigner]]:
    data = tmp_path / "data"
    init_test_keys(data)
    settings = Settings(env="development", data_dir=data, public_base_url="http://testserver")
    upgrade(settings.resolved_database_url)
    with TestClient(create_app(settings)) as client:
        services = client.app.state.services  # type: ignore[attr-defined]
        signer = CountingSigner(services.publisher.signer)
        services.publisher.signer = signer
        with services.session_factory() as s:
            _, secret = create_token(s, ["rollout"], name="ops")
            s.commit()
        yield client, {"Authorization": f"Bearer {secret}"}, signer


def serials(client: TestClient, channel: str) -> list[int]:
    factory = client.app.state.services.session_factory  # type: ignore[attr-defined]
    with factory() as s:
        return list(s.scalars(
            select(db.SignedManifest.serial).join(db.Channel)
            .where(db.Channel.name == channel).order_by(db.SignedManifest.serial)))


def make_version(client: TestClient, model: str, state: str = "ready") -> None:
    services = client.app.state.services  # type: ignore[attr-defined]
    version_maker(services.session_factory, services.blob_store)(model, "1.0", state=state)


def test_a_first_rollout_on_a_new_channel_signs_one_manifest(app) -> None:
    """It used to sign the new channel's empty manifest, then the one offering the release."""
    client, headers, signer = app
    make_version(client, "clf")
    r = client.post("/v1/channels/beta/rollouts", headers=headers,
                    json={"model": "clf", "version": "1.0", "percentage": 10})
    assert r.status_code == 201, r.text
    assert (signer.signatures, serials(client, "beta"), r.json()["serial"]) == (1, [1], 1)
    store = client.app.state.services.blob_store  # type: ignore[attr-defined]
    assert list(store.list_keys("manifests/beta/")) == ["manifests/beta/1.json"]
    actions = [e["action"] for e in client.get("/v1/audit", headers=headers).json()["events"]]
    assert actions[:2] == ["rollout.start", "channel.create"]  # both audited, one publish


def test_a_refused_first_rollout_creates_no_channel_and_signs_nothing(app) -> None:
    client, headers, signer = app
    make_version(client, "clf", state="compiling")
    r = client.post("/v1/channels/beta/rollouts", headers=headers,
                    json={"model": "clf", "version": "1.0", "percentage": 10})
    assert r.status_code == 409, r.text
    assert signer.signatures == 0
    assert client.get("/v1/channels", headers=headers).json() == []


def test_every_rollout_change_is_one_signed_serial(app) -> None:
    client, headers, signer = app
    assert client.post("/v1/channels", json={"name": "prod"},
                       headers=headers).status_code == 201
    make_version(client, "clf")
    make_version(client, "det")
    rid = client.post("/v1/channels/prod/rollouts", headers=headers, json={
        "model": "clf", "version": "1.0", "percentage": 5}).json()["id"]
    shadow = client.post("/v1/channels/prod/rollouts", headers=headers, json={
        "model": "det", "version": "1.0", "percentage": 5, "mode": "shadow",
        "shadow": {"max_kl_micro": 1000, "max_latency_p99_us": 50_000, "min_samples": 10},
    }).json()["id"]
    calls = [
        ("patch", f"/v1/rollouts/{rid}", {"percentage": 20}),
        ("post", f"/v1/rollouts/{rid}/pause", None),
        ("post", f"/v1/rollouts/{rid}/resume", None),
        ("post", f"/v1/rollouts/{rid}/pin", {"device_ids": ["dev-1"]}),
        ("post", f"/v1/rollouts/{rid}/unpin", {"device_ids": ["dev-1"]}),
        # promote and ramp in one request: one manifest, two audit events
        ("patch", f"/v1/rollouts/{shadow}", {"mode": "active", "percentage": 50}),
        ("post", f"/v1/rollouts/{rid}/halt", {"reason": "test"}),
        ("post", "/v1/channels/prod/publish", None),
    ]
    for method, path, body in calls:
        before_signatures, before = signer.signatures, serials(client, "prod")
        r = client.request(method.upper(), path, headers=headers, json=body)
        assert r.status_code in (200, 201), (path, r.text)
        assert signer.signatures - before_signatures == 1, path
        assert serials(client, "prod") == [*before, before[-1] + 1], path
    assert signer.signatures == 1 + 2 + len(calls)  # channel, two starts, the calls
    promoted = client.get(f"/v1/rollouts/{shadow}", headers=headers).json()
    assert (promoted["mode"], promoted["share_ppm"]) == ("active", 500_000)
    actions = [e["action"] for e in client.get("/v1/audit", headers=headers).json()["events"]]
    assert "rollout.promote" in actions and actions.count("rollout.ramp") == 2
    # a change that changes nothing signs nothing
    before = signer.signatures
    r = client.post(f"/v1/rollouts/{rid}/halt", headers=headers)
    assert (r.status_code, r.json()["serial"], signer.signatures) == (200, None, before)


def test_the_served_manifest_is_written_from_the_signed_bytes_not_read_back(app) -> None:
    client, headers, _ = app
    services = client.app.state.services  # type: ignore[attr-defined]
    store = ReadRecordingStore(services.blob_store.root)
    services.publisher.blob_store = store
    make_version(client, "clf")
    r = client.post("/v1/channels/prod/rollouts", headers=headers,
                    json={"model": "clf", "version": "1.0", "percentage": 10})
    assert r.status_code == 201, r.text
    assert [k for k in store.reads if k.startswith(("manifests/", "v1/channels/"))] == []
    with store.open("manifests/prod/1.json") as signed, \
            store.open("v1/channels/prod/manifest") as served:
        assert served.read() == signed.read()
    factory = services.session_factory
    with factory() as s:
        assert s.scalar(select(func.count()).select_from(db.SignedManifest)) == 1
