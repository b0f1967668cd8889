"""A version with published versions to patch from is `patching` until its patch job settles,
then `ready`: the first manifest of its rollout lists the patches. A patch job that fails never
holds the release back — the version turns ready at once, devices download the full artifact,
and the failure is on the version (`patches`) and in the audit log. Real uploads and builds on
the in-process worker, the SDK over the app's routes (SQLite and PostgreSQL)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from client_sdk import DeviceProfile, Outcome, Updater, UpdaterConfig, Via
from server.app import create_app
from server.auth import create_token
from server.blobstore import BlobBackendError, LocalBlobStore
from server.jobs.runner import wait_for
from tests.cli.cli_support import write_weighted_model
from tests.client.test_against_server import AppTransport
from tests.jobs.jobs_helpers import make_settings, uploader
from tests.support.server_keys import init_test_keys

INPUTS = [{"name": "x", "dtype": "float32", "shape": [1, 192]}]


class PatchOutageStore(LocalBlobStore):
    """A local store that refuses every patch blob, as S3 does during an outage."""

    def __init__(self, root: Any) -> None:
        super().__init__(root)
        self.refused = 0

    def put(self, key: str, *args: Any, **kw: Any) -> Any:
        if key.startswith("v1/patches/"):
            self.refused += 1
            raise BlobBackendError("storage unavailable (injected)")
        return super().put(key, *args, **kw)


def _settled(client: TestClient, version: str) -> dict[str, Any]:
    path = f"/v1/models/weights/versions/{version}"
    assert wait_for(lambda: client.get(path).json()["state"] in ("ready", "failed"), 180, 0.2)
    return dict(client.get(path).json())


def test_a_failing_patch_job_still_makes_the_version_ready_and_devices_download_in_full(
        database_url: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    init_test_keys(data)
    settings = make_settings(database_url, data)
    store = PatchOutageStore(settings.resolved_blob_dir)
    app = create_app(settings, blob_store=store)
    with TestClient(app, base_url="http://testserver") as client:
        with app.state.session_factory() as s:
            _, secret = create_token(s, ["publish", "rollout"], name="ops")
            s.commit()
        client.headers["Authorization"] = f"Bearer {secret}"
        upload = uploader(client, secret)
        device = Updater(UpdaterConfig(
            base_url="http://testserver", channel="prod",
            pinned_root=client.get("/v1/root/1.json").content,
            device=DeviceProfile("edge-1", "onnx"), data_dir=tmp_path / "device",
            transport=AppTransport(client), formats=["onnx"]))

        upload("weights", "1.0.0", write_weighted_model(tmp_path / "v1.onnx"), INPUTS, ["onnx"])
        assert _settled(client, "1.0.0")["state"] == "ready"
        r = client.post("/v1/channels/prod/rollouts", json={
            "model": "weights", "version": "1.0.0", "percentage": 100})
        assert r.status_code == 201, r.text
        assert device.check_once().models[0].via is Via.FULL

        upload("weights", "2.0.0", write_weighted_model(tmp_path / "v2.onnx", edit=40), INPUTS,
               ["onnx"])
        v2 = _settled(client, "2.0.0")
        # Ready although its patch could not be stored; the reason is on the version.
        assert v2["state"] == "ready" and store.refused >= 1
        assert v2["patches"]["patches"] == 0 and v2["patches"]["attempts"] >= 1
        assert "storage unavailable (injected)" in v2["patches"]["error"], v2["patches"]
        audit = client.get("/v1/audit", params={"action": "patches.failed"})
        assert audit.status_code == 200, audit.text
        [event] = audit.json()["events"]
        assert "storage unavailable" in event["details"]["error"]

        r = client.post("/v1/channels/prod/rollouts", json={
            "model": "weights", "version": "2.0.0", "percentage": 100})
        assert r.status_code == 201, r.text
        result = device.check_once()
        [model] = result.models
        [build] = client.get("/v1/models/weights/versions/2.0.0/builds").json()
        artifact = build["artifact"]
        # In full: the artifact, or its smaller compressed copy where the server made one.
        length = (artifact["compressed"] or artifact)["length"]
        assert (result.outcome, model.version, model.via, model.nbytes) == (
            Outcome.UPDATED, "2.0.0", Via.FULL, length)
    app.state.job_queue.close()
