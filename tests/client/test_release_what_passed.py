"""Release what passed: a version whose portable ONNX build passed while another platform
failed can be rolled out only when the release engineer opts in; the manifest and the API say
which platforms failed, and a device of a failed platform lands on the ONNX artifact.

Real server app (in-process job queue, real compile pipeline and gates), real SDK.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from client_sdk import DeviceProfile, ModelRuntime, Outcome, Updater, UpdaterConfig
from manifests import Manifest
from tests.client.onnx_models import check_whole, scaled_model
from tests.client.test_against_server import AppTransport
from tests.support.inprocess_app import inprocess_app, wait_settled

X = np.ones((1, 4), dtype=np.float32)
# The Core ML build is refused by its operator gate (a per-version deny of Mul): a real gate
# failure, without waiting for a converter to break.
META = {"version": "1.0.0",
        "platforms": {"onnx": {}, "coreml": {"deny_ops": "Mul"}},
        "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 4]}]}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[TestClient]:
    with inprocess_app(tmp_path) as client:
        yield client


def _upload_and_settle(client: TestClient) -> dict[str, object]:
    assert client.post("/v1/models", json={"name": "clf", "task": "classification"}
                       ).status_code == 201
    r = client.post("/v1/models/clf/versions",
                    files={"model": ("m.onnx", scaled_model(3.0), "application/octet-stream")},
                    data={"metadata": json.dumps(META)})
    assert r.status_code == 201, r.text
    return wait_settled(client, "clf", "1.0.0", timeout_s=120)


def test_failed_platform_refused_without_opt_in_then_its_device_gets_the_onnx_artifact(
        server: TestClient, tmp_path: Path) -> None:
    version = _upload_and_settle(server)
    assert version["state"] == "failed"
    assert version["failed_platforms"] == ["coreml"]
    assert version["can_release_what_passed"] is True
    builds = {b["platform"]: b for b in server.get("/v1/models/clf/versions/1.0.0/builds").json()}
    assert builds["onnx"]["state"] == "succeeded" and builds["coreml"]["state"] == "failed"
    assert "Mul" in builds["coreml"]["error"]

    # Without the opt-in: 409 naming the failed platform and the way out.
    body = {"model": "clf", "version": "1.0.0", "percentage": 100}
    refused = server.post("/v1/channels/prod/rollouts", json=body)
    assert refused.status_code == 409, refused.text
    assert "coreml" in refused.json()["detail"]
    assert "allow_failed_platforms" in refused.json()["fix"]

    started = server.post("/v1/channels/prod/rollouts",
                          json={**body, "allow_failed_platforms": True})
    assert started.status_code == 201, started.text
    assert started.json()["failed_platforms"] == ["coreml"]
    assert server.get(f"/v1/rollouts/{started.json()['id']}").json()["failed_platforms"] == [
        "coreml"]

    # The signed manifest lists the failed platform on the release.
    envelope = json.loads(server.get("/v1/channels/prod/manifest").content)
    manifest = Manifest.from_bytes(base64.b64decode(envelope["payload"]))
    (release,) = manifest.models["clf"].releases
    assert release.failed_platforms == ["coreml"]
    assert {a.platform for a in release.artifacts} == {"onnx"}

    # A Core ML device (it runs mlpackage and CPU ONNX) installs the portable artifact.
    runtime = ModelRuntime(tmp_path / "mac")
    up = Updater(UpdaterConfig(
        base_url="http://testserver", channel="prod",
        pinned_root=server.get("/v1/root/1.json").content,
        device=DeviceProfile("mac-1", "coreml", arch="arm64"), data_dir=tmp_path / "mac",
        transport=AppTransport(server), runtime=runtime, formats=["mlpackage", "onnx"]))
    result = up.check_once()
    assert result.outcome is Outcome.UPDATED, result
    prediction = runtime.predict("clf", {"x": X})
    assert prediction.version == "1.0.0"
    assert prediction.sha256 == release.artifacts[0].sha256
    assert check_whole(prediction.outputs, X) == 3.0
