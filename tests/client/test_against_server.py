"""The SDK against the real server app (issue 5's serving and rollout API), in process.

The device talks to the FastAPI app through a Transport over Starlette's TestClient — the SDK's
one network seam — so the real routes, signing keys, ETags, Range and rollout changes are
exercised. Checks the contract end to end: install, patch update, halt → rollback.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import bsdiff4
import numpy as np
import pytest
from fastapi.testclient import TestClient

from client_sdk import (
    DeviceProfile,
    ModelRuntime,
    Outcome,
    Response,
    Updater,
    UpdaterConfig,
    Via,
)
from server.auth import create_token
from server.blobstore import LocalBlobStore
from server.db import models as db
from tests.client.onnx_models import check_whole, scaled_model
from tests.support.inprocess_app import inprocess_app

X = np.ones((1, 4), dtype=np.float32)


class AppTransport:
    """A Transport over the in-process app (what UrllibTransport does over a socket)."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.paths: list[str] = []

    def fetch(self, url: str, headers: Mapping[str, str], timeout: float) -> Response:
        r = self.client.get(url, headers=dict(headers), follow_redirects=True)
        self.paths.append(r.url.path)
        return Response(r.status_code, {k.lower(): v for k, v in r.headers.items()},
                        iter([r.content]), str(r.url))

    def post(self, url: str, body: bytes, headers: Mapping[str, str],
             timeout: float) -> Response:
        r = self.client.post(url, content=body, headers=dict(headers))
        self.paths.append(r.url.path)
        return Response(r.status_code, {k.lower(): v for k, v in r.headers.items()},
                        iter([r.content]), str(r.url))


@pytest.fixture
def server(tmp_path):
    with inprocess_app(tmp_path, scopes=("rollout",)) as client:
        yield client, client.app.state.blob_store


def add_version(client: TestClient, blobs: LocalBlobStore, model: str, version: str,
                data: bytes, patch_from: bytes | None = None) -> None:
    """A ready version with one portable ONNX artifact, as server/compile records it."""
    sha = hashlib.sha256(data).hexdigest()
    blobs.put(f"artifacts/{sha}", [data])
    with client.app.state.session_factory() as s:
        m = s.query(db.Model).filter_by(name=model).first()
        if m is None:
            m = db.Model(name=model)
            s.add(m)
            s.flush()
        v = db.ModelVersion(model_id=m.id, version=version, state=db.VersionState("ready"),
                            metadata_json={}, source_format="onnx")
        s.add(v)
        s.flush()
        art = db.Artifact(version_id=v.id, platform="onnx", variant="", format="onnx",
                          sha256=sha, length=len(data), blob_key=f"artifacts/{sha}",
                          target={"runtime": "onnxruntime"}, compile_settings={})
        s.add(art)
        s.flush()
        if patch_from is not None:
            base_sha = hashlib.sha256(patch_from).hexdigest()
            base = s.query(db.Artifact).filter_by(sha256=base_sha).first()
            body = bsdiff4.diff(patch_from, data)
            psha = hashlib.sha256(body).hexdigest()
            blobs.put(f"patches/{psha}", [body])
            s.add(db.Patch(from_artifact_id=base.id, to_artifact_id=art.id, algorithm="bsdiff4",
                           sha256=psha, length=len(body), blob_key=f"patches/{psha}"))
        s.commit()


def test_device_installs_patches_and_rolls_back_against_the_real_server(server, tmp_path):
    client, blobs = server
    v1 = scaled_model(1.0, padding=20_000)
    v2 = scaled_model(2.0, padding=20_000, tweak=50)
    assert client.post("/v1/channels", json={"name": "prod"}).status_code == 201
    add_version(client, blobs, "clf", "1.0", v1)
    r = client.post("/v1/channels/prod/rollouts",
                    json={"model": "clf", "version": "1.0", "percentage": 100})
    assert r.status_code == 201, r.text

    transport = AppTransport(client)
    runtime = ModelRuntime(tmp_path / "device", shadow_budget=None)
    up = Updater(UpdaterConfig(
        base_url="http://testserver", channel="prod",
        pinned_root=client.get("/v1/root/1.json").content,
        device=DeviceProfile("edge-1", "onnx", arch="x86_64"), data_dir=tmp_path / "device",
        transport=transport, runtime=runtime, formats=["onnx"]))
    first = up.check_once()
    assert first.outcome is Outcome.UPDATED, first
    assert (first.models[0].via, first.models[0].nbytes) == (Via.FULL, len(v1))
    assert check_whole(runtime.predict("clf", {"x": X}).outputs, X) == 1.0
    assert up.check_once().outcome is Outcome.UP_TO_DATE

    add_version(client, blobs, "clf", "2.0", v2, patch_from=v1)
    r = client.post("/v1/channels/prod/rollouts",
                    json={"model": "clf", "version": "2.0", "percentage": 100})
    assert r.status_code == 201, r.text
    rollout_id = r.json()["id"]
    transport.paths.clear()
    second = up.check_once()
    assert second.outcome is Outcome.UPDATED and second.models[0].version == "2.0", second
    assert any(p.startswith("/v1/patches/") for p in transport.paths)
    assert not any(p.startswith("/v1/artifacts/") for p in transport.paths)
    assert second.models[0].via is Via.PATCH and 0 < second.models[0].nbytes < len(v2) / 4
    assert runtime.predict("clf", {"x": X}).version == "2.0"

    assert client.post(f"/v1/rollouts/{rollout_id}/halt").status_code == 200
    third = up.check_once()
    assert third.outcome is Outcome.ROLLED_BACK and third.models[0].version == "1.0", third
    assert (third.models[0].via, third.models[0].nbytes) == (Via.HELD, 0)  # kept on the device
    assert runtime.predict("clf", {"x": X}).version == "1.0"


def test_shadow_failure_reported_by_the_sdk_halts_the_rollout_on_the_real_server(
        server, tmp_path):
    """The SDK's reports pass the server's strict validation as they are, and a failed
    shadow verdict they carry makes the server's guard halt the release."""
    from client_sdk import Reporter, SystemClock

    client, blobs = server
    assert client.post("/v1/channels", json={"name": "prod"}).status_code == 201
    add_version(client, blobs, "clf", "1.0", scaled_model(1.0))
    add_version(client, blobs, "clf", "2.0", scaled_model(3.0))  # its outputs diverge
    assert client.post("/v1/channels/prod/rollouts", json={
        "model": "clf", "version": "1.0", "percentage": 100}).status_code == 201
    r = client.post("/v1/channels/prod/rollouts", json={
        "model": "clf", "version": "2.0", "percentage": 100, "mode": "shadow",
        "shadow": {"max_kl_micro": 1000, "max_latency_p99_us": 1_000_000, "min_samples": 5},
        "guard": {"min_devices": 1, "max_fail_share": 0.5}})
    assert r.status_code == 201, r.text
    rollout_id = r.json()["id"]
    with client.app.state.session_factory() as s:
        _, enroll = create_token(s, ["enroll"], name="devices")
        s.commit()

    data = tmp_path / "device"
    transport = AppTransport(client)
    device = DeviceProfile("edge-1", "onnx", arch="x86_64")
    up = Updater(UpdaterConfig(
        base_url="http://testserver", channel="prod",
        pinned_root=client.get("/v1/root/1.json").content, device=device, data_dir=data,
        transport=transport, formats=["onnx"]))
    result = up.check_once()
    assert [(c.version, c.verdict) for c in result.candidates] == [("2.0", "pending")]

    app = ModelRuntime(data, shadow_budget=None)
    rng = np.random.default_rng(3)
    for _ in range(5):
        x = rng.standard_normal((1, 4)).astype(np.float32)
        assert check_whole(app.predict("clf", {"x": x}).outputs, x) == 1.0
        app.flush_shadow()
    app.close()

    rep = Reporter(data, "http://testserver", transport, device, SystemClock(), channel="prod")
    assert rep.enroll(enroll)
    rep.collect()
    pending = len(rep.outbox.files())
    sent = rep.flush()
    assert (sent.status, sent.sent, sent.pending) == ("ok", pending, 0), sent
    got = client.get(f"/v1/rollouts/{rollout_id}").json()
    assert got["state"] == "halted", got
    assert got["health"]["devices"]["failed"] == 1
    assert [c.verdict for c in up.check_once().candidates] == []  # withdrawn: nothing offered
