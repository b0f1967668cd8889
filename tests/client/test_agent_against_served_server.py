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
