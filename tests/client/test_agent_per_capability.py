"""Artifacts per capability end to end: `modelfleet serve` compiles one upload for two HTP
generations (SM8350 = HTP v68, no FP16: built at INT8 by rule; SM8650 = v75: FP16, as the
version asks), publishes both with what each requires, and two device agents with those
hardware profiles each install the artifact of their own generation over real HTTP."""

from __future__ import annotations

import base64
import json
import time

import httpx
import pytest

from server.compile import InputSpec
from tests.client.test_agent_against_served_server import _mf, served  # noqa: F401
from tests.compile.compile_models import build_model, torch_models

pytestmark = pytest.mark.slow


def test_devices_of_two_htp_generations_get_the_artifact_their_hardware_runs(
        served, tmp_path):  # noqa: F811
    base, client = served
    conv, _ = torch_models()
    (tmp_path / "m").mkdir()
    model = build_model(tmp_path / "m", "convnet", conv, InputSpec("image", (1, 3, 16, 16)), 1)
    (tmp_path / "root.json").write_bytes(httpx.get(f"{base}/v1/root/1.json").content)
    assert client.post("/v1/models", json={"name": "clf"}).status_code == 201
    meta = {"version": "1.0.0",
            "platforms": {"onnx": {}, "qnn": {"targets": "SM8350,SM8650",
                                              "target_precision": "SM8650=fp16"}},
            "inputs": [{"name": "image", "dtype": "float32", "shape": [1, 3, 16, 16]}]}
    r = client.post("/v1/models/clf/versions", data={"metadata": json.dumps(meta)}, files={
        "model": ("m.onnx", model.onnx.read_bytes()),
        "calibration": ("cal.npz", model.calibration.read_bytes()),
        "reference": ("ref.npz", model.reference.read_bytes())})
    assert r.status_code in (200, 201), r.text
    for _ in range(600):
        state = client.get("/v1/models/clf/versions/1.0.0").json()["state"]
        if state in ("ready", "failed"):
            break
        time.sleep(0.5)
    builds = client.get("/v1/models/clf/versions/1.0.0/builds?logs=false").json()
    assert state == "ready", [(b["platform"], b["error"]) for b in builds]
    qnn = next(b for b in builds if b["platform"] == "qnn")
    by_soc = {a["target"]["soc"]: a for a in qnn["artifacts"]}
    assert by_soc["SM8350"]["compile_settings"]["precision"] == "int8"
    assert by_soc["SM8650"]["compile_settings"]["precision"] == "fp16"
    assert client.post("/v1/channels", json={"name": "prod"}).status_code == 201
    assert client.post("/v1/channels/prod/rollouts", json={
        "model": "clf", "version": "1.0.0", "percentage": 100}).status_code == 201
    envelope = httpx.get(f"{base}/v1/channels/prod/manifest").json()
    doc = json.loads(base64.b64decode(envelope["payload"]))
    offered = {a["target"]["soc"]: a.get("requires") for a in
               doc["models"]["clf"]["releases"][0]["artifacts"] if a["platform"] == "qnn"}
    assert offered == {"SM8350": ["htp_int8"], "SM8650": ["htp_fp16"]}  # signed with each
    got = {}
    for soc, arch in (("SM8350", "v68"), ("SM8650", "v75")):
        done = _mf("device", "update", "--server", base, "--channel", "prod", "--root",
                   str(tmp_path / "root.json"), "--data-dir", str(tmp_path / soc),
                   "--device-id", f"phone-{soc}", "--platform", "qnn", "--soc", soc,
                   "--arch", arch, "--once")
        assert done.returncode == 0, done.stderr
        got[soc] = json.loads(done.stdout)["active"][0]["sha256"]
    assert got["SM8350"] == by_soc["SM8350"]["sha256"]
    assert got["SM8650"] == by_soc["SM8650"]["sha256"]
    assert got["SM8350"] != got["SM8650"]
