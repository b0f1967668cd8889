"""The device agent against the real server as users run them: `modelfleet serve` in a
subprocess (SQLite + local blobs + in-process compile worker), an ONNX upload compiled by the
pipeline, a rollout, then `modelfleet device update/predict` over real HTTP; halt → rollback;
a device pinned to another root refuses with exit 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.client.onnx_models import scaled_model
from tests.client.simulator import FakeClock, RepositorySimulator
from tests.support.served import free_port, wait_until_up

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _mf(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "modelfleet", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)


@pytest.fixture
def served(tmp_path):
    data = tmp_path / "srv"
    assert _mf("keys", "init", "--data-dir", str(data), "--root-keys", "1",
               "--threshold", "1").returncode == 0
    made = _mf("tokens", "create", "--data-dir", str(data), "--name", "e2e",
               "--scope", "publish", "--scope", "rollout")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip().splitlines()[-1]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "MODELFLEET_PUBLIC_BASE_URL": base}
    log = tmp_path / "serve.log"
    proc = subprocess.Popen([sys.executable, "-m", "modelfleet", "serve", "--data-dir", str(data),
                             "--port", str(port)], cwd=REPO, env=env,
                            stdout=(out := log.open("wb")), stderr=subprocess.STDOUT)
    try:
        wait_until_up(f"{base}/v1/root/1.json", proc, log)
        client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"},
                              timeout=60)
        yield base, client
    finally:
        proc.terminate()
        proc.wait(30)
        out.close()


def _upload(client: httpx.Client, version: str, data: bytes) -> None:
    meta = {"version": version, "platforms": ["onnx"],
            "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 4]}]}
    r = client.post("/v1/models/clf/versions", files={"model": ("m.onnx", data)},
                    data={"metadata": json.dumps(meta)})
    assert r.status_code in (200, 201), r.text
    for _ in range(240):
        state = client.get(f"/v1/models/clf/versions/{version}").json()["state"]
        if state in ("ready", "failed"):
            break
        time.sleep(0.5)
    assert state == "ready"


def test_agent_updates_predicts_and_rolls_back_against_modelfleet_serve(served, tmp_path):
    base, client = served
    (tmp_path / "root.json").write_bytes(httpx.get(f"{base}/v1/root/1.json").content)
    assert client.post("/v1/models", json={"name": "clf"}).status_code == 201
    _upload(client, "1.0.0", scaled_model(1.0, padding=1000))
    assert client.post("/v1/channels", json={"name": "prod"}).status_code == 201
    assert client.post("/v1/channels/prod/rollouts", json={
        "model": "clf", "version": "1.0.0", "percentage": 100}).status_code == 201
    dev = tmp_path / "dev"
    update = ["device", "update", "--server", base, "--channel", "prod", "--root",
              str(tmp_path / "root.json"), "--data-dir", str(dev), "--device-id", "edge-1",
              "--platform", "onnx", "--once"]
    first = _mf(*update)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["active"][0]["version"] == "1.0.0"

    _upload(client, "2.0.0", scaled_model(2.0, padding=1000, tweak=5))
    r = client.post("/v1/channels/prod/rollouts", json={
        "model": "clf", "version": "2.0.0", "percentage": 100})
    assert r.status_code == 201, r.text
    assert json.loads(_mf(*update).stdout)["outcome"] == "updated"
    np.savez(tmp_path / "x.npz", x=np.ones((1, 4), dtype=np.float32))
    pred = json.loads(_mf("device", "predict", "--data-dir", str(dev), "--model", "clf",
                          "--input", str(tmp_path / "x.npz")).stdout)
    assert pred["version"] == "2.0.0" and pred["outputs"]["y"]["data"] == [[2.0] * 4]

    assert client.post(f"/v1/rollouts/{r.json()['id']}/halt").status_code == 200
    back = json.loads(_mf(*update).stdout)
    assert back["outcome"] == "rolled_back" and back["active"][0]["version"] == "1.0.0"

    (tmp_path / "other_root.json").write_bytes(RepositorySimulator(FakeClock()).pinned_root)
    other = [a if a != str(tmp_path / "root.json") else str(tmp_path / "other_root.json")
             for a in update]
    refused = _mf(*[a if a != str(dev) else str(tmp_path / "dev2") for a in other])
    assert refused.returncode == 1 and "SignatureError" in refused.stderr


@pytest.mark.parametrize("kind", ["conv", "lstm"])
def test_a_quantized_upload_reaches_the_device_as_its_own_int8_graph(served, tmp_path, kind):
    """A dynamically quantized upload: the onnx build ships the upload's int8 graph
    (server/compile/quantized_upload.py) and the device predicts what the upload itself
    computes. `conv`: a named batch dim, fixed. `lstm`: a contrib DynamicQuantizeLSTM behind
    shape arithmetic, shipped folded with its shapes from the FP32 rewrite."""
    import onnx
    import onnxruntime as ort

    from tests.support.quantized import quantized_conv_upload, quantized_lstm_upload

    base, client = served
    (tmp_path / "root.json").write_bytes(httpx.get(f"{base}/v1/root/1.json").content)
    upload, shape = (quantized_conv_upload(tmp_path, batch="N"), [1, 3, 16, 16]) \
        if kind == "conv" else (quantized_lstm_upload(tmp_path), [6, 1, 8])
    name = f"q8{kind}"
    assert client.post("/v1/models", json={"name": name}).status_code == 201
    meta = {"version": "1.0.0", "platforms": ["onnx"],
            "inputs": [{"name": "x", "dtype": "float32", "shape": shape}]}
    r = client.post(f"/v1/models/{name}/versions",
                    files={"model": ("int8.onnx", upload.read_bytes())},
                    data={"metadata": json.dumps(meta)})
    assert r.status_code == 201, r.text
    for _ in range(240):
        version = client.get(f"/v1/models/{name}/versions/1.0.0").json()
        if version["state"] in ("ready", "failed"):
            break
        time.sleep(0.5)
    assert version["state"] == "ready", version["builds"]
    (build,) = client.get(f"/v1/models/{name}/versions/1.0.0/builds").json()
    assert build["artifact"]["variant"] == "int8", build["artifact"]
    assert build["artifact"]["compile_settings"]["quantized"] == "upload"
    channel = f"prod-{kind}"
    assert client.post("/v1/channels", json={"name": channel}).status_code == 201
    assert client.post(f"/v1/channels/{channel}/rollouts", json={
        "model": name, "version": "1.0.0", "percentage": 100}).status_code == 201
    dev = tmp_path / "dev"
    updated = _mf("device", "update", "--server", base, "--channel", channel, "--root",
                  str(tmp_path / "root.json"), "--data-dir", str(dev), "--device-id", "edge-1",
                  "--platform", "onnx", "--once")
    assert updated.returncode == 0, updated.stderr
    x = np.random.default_rng(3).random(shape, dtype=np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    pred = json.loads(_mf("device", "predict", "--data-dir", str(dev), "--model", name,
                          "--input", str(tmp_path / "x.npz")).stdout)
    (want,) = ort.InferenceSession(str(upload), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    np.testing.assert_allclose(np.asarray(pred["outputs"]["y"]["data"]), want, rtol=0,
                               atol=1e-6)
    integer = {"DynamicQuantizeLinear", "DynamicQuantizeLSTM"}
    assert any(integer & {n.op_type for n in onnx.load(str(p)).graph.node}
               for p in dev.rglob("*.onnx"))
