"""Protected releases end to end (issue 23, docs/security.md): `modelfleet serve` in a
subprocess (SQLite, local blobs, the in-process compile and patch worker), protected ONNX
uploads, and `modelfleet device update/predict` over real HTTP. An enrolled device gets each
release's content key sealed to it, downloads, patches, verifies, decrypts and predicts; a
device that is not enrolled, revoked, or not offered the release gets no key and keeps its
model; neither the bucket nor the device holds the weights in the clear."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from client_sdk import SystemClock, UrllibTransport
from client_sdk.errors import ContentKeyError, LocalKeyError
from client_sdk.install import BundleStore
from client_sdk.protection import AT_REST, KeyClient, keystore_for, read_plain
from tests.support.served import free_port, wait_until_up

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
N_WEIGHTS = 6000


def _mf(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "modelfleet", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=180)


def weights(seed: int, tweak: int = 0) -> np.ndarray:
    w = np.random.default_rng(seed).standard_normal(N_WEIGHTS).astype(np.float32)
    w[:tweak] += 1.0
    return w


def weighted_model(k: float, w: np.ndarray) -> bytes:
    """y = x*k, tag = [k], wsum = sum(w): the weights `w` are used, so every compile keeps
    them as float32 bytes."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4]),
            helper.make_tensor_value_info("tag", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("wsum", TensorProto.FLOAT, [])]
    nodes = [helper.make_node("Mul", ["x", "k"], ["y"]),
             helper.make_node("Identity", ["k"], ["tag"]),
             helper.make_node("ReduceSum", ["w"], ["wsum"], keepdims=0)]
    inits = [numpy_helper.from_array(np.array([k], dtype=np.float32), "k"),
             numpy_helper.from_array(w, "w")]
    model = helper.make_model(helper.make_graph(nodes, "weighted", [x], outs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


# Weight bytes the protected releases carry (untweaked, so in every version), and a control
# model's, uploaded unprotected: the grep must find the control's, or it proves nothing.
SECRET = weights(23)[1000:1064].tobytes()
CONTROL = weights(7)[1000:1064].tobytes()


def files_holding(root: Path, needle: bytes) -> list[str]:
    return [str(p.relative_to(root)) for p in sorted(root.rglob("*"))
            if p.is_file() and needle in p.read_bytes()]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("protected")
    data = tmp / "srv"
    assert _mf("keys", "init", "--data-dir", str(data), "--root-keys", "1",
               "--threshold", "1").returncode == 0
    tokens = {}
    for name, scopes in (("ops", ["publish", "rollout"]), ("app", ["enroll"])):
        made = _mf("tokens", "create", "--data-dir", str(data), "--name", name,
                   *[a for s in scopes for a in ("--scope", s)])
        assert made.returncode == 0, made.stderr
        tokens[name] = made.stdout.strip().splitlines()[-1]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "MODELFLEET_PUBLIC_BASE_URL": base}
    log = tmp / "serve.log"
    proc = subprocess.Popen([sys.executable, "-m", "modelfleet", "serve", "--data-dir",
                             str(data), "--port", str(port)], cwd=REPO, env=env,
                            stdout=(out := log.open("wb")), stderr=subprocess.STDOUT)
    try:
        wait_until_up(f"{base}/v1/root/1.json", proc, log)
        (tmp / "root.json").write_bytes(httpx.get(f"{base}/v1/root/1.json").content)
        client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {tokens['ops']}"},
                              timeout=60)
        for model in ("clf", "open"):
            assert client.post("/v1/models", json={"name": model}).status_code == 201
        for channel in ("prod", "beta"):
            assert client.post("/v1/channels", json={"name": channel}).status_code == 201
        yield {"base": base, "client": client, "tmp": tmp, "data": data,
               "enroll": tokens["app"]}
    finally:
        proc.terminate()
        proc.wait(30)
        out.close()


def _upload(client: httpx.Client, model: str, version: str, data: bytes, *,
            protected: bool) -> dict[str, Any]:
    meta = {"version": version, "platforms": ["onnx"], "protected": protected,
            "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 4]}]}
    r = client.post(f"/v1/models/{model}/versions", files={"model": ("m.onnx", data)},
                    data={"metadata": json.dumps(meta)})
    assert r.status_code in (200, 201), r.text
    for _ in range(240):
        got = client.get(f"/v1/models/{model}/versions/{version}").json()
        if got["state"] in ("ready", "failed"):
            break
        time.sleep(0.5)
    assert got["state"] == "ready", got
    return dict(got)


def _rollout(client: httpx.Client, model: str, version: str, channel: str = "prod",
             percentage: int = 100) -> dict[str, Any]:
    r = client.post(f"/v1/channels/{channel}/rollouts", json={
        "model": model, "version": version, "percentage": percentage})
    assert r.status_code == 201, r.text
    return dict(r.json())


def _update(env: dict[str, Any], device: str, *, enrol: bool = True,
            model: str = "clf", channel: str = "prod") -> tuple[int, dict[str, Any], str]:
    args = ["device", "update", "--server", env["base"], "--channel", channel, "--root",
            str(env["tmp"] / "root.json"), "--data-dir", str(env["tmp"] / device),
            "--device-id", device, "--platform", "onnx", "--model", model, "--once"]
    if enrol:
        args += ["--enroll-token", env["enroll"]]
    done = _mf(*args)
    return done.returncode, json.loads(done.stdout or "{}"), done.stderr


def _predict(env: dict[str, Any], device: str, model: str = "clf", width: int = 4
             ) -> dict[str, Any]:
    x = env["tmp"] / f"x{width}.npz"
    np.savez(x, x=np.ones((1, width), dtype=np.float32))
    done = _mf("device", "predict", "--data-dir", str(env["tmp"] / device), "--model", model,
               "--input", str(x))
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def _key_client(env: dict[str, Any], device: str, channel: str) -> KeyClient:
    return KeyClient(env["tmp"] / device, env["base"], UrllibTransport(), device, channel,
                     SystemClock(), 30)


@pytest.fixture(scope="module")
def updated(served: dict[str, Any]) -> dict[str, Any]:
    """edge-1 enrolled, on clf 1.0.0 (downloaded in full) then 2.0.0 (via a patch)."""
    env, client = served, served["client"]
    _upload(client, "open", "1.0.0", weighted_model(1.0, weights(7)), protected=False)
    _rollout(client, "open", "1.0.0")
    _upload(client, "clf", "1.0.0", weighted_model(1.0, weights(23)), protected=True)
    _rollout(client, "clf", "1.0.0")
    code, first, err = _update(env, "edge-1")
    assert code == 0, err
    assert first["models"][0]["via"] == "full" and first["active"][0]["version"] == "1.0.0"
    env["first"] = first
    env["manifest1"] = httpx.get(f"{env['base']}/v1/channels/prod/manifest").json()
    env["pred1"] = _predict(env, "edge-1")
    _upload(client, "clf", "2.0.0", weighted_model(2.0, weights(23, tweak=8)), protected=True)
    _rollout(client, "clf", "2.0.0")
    code, second, err = _update(env, "edge-1")
    assert code == 0, err
    env["second"] = second
    env["pred2"] = _predict(env, "edge-1")
    return env


def test_enrolled_device_patches_decrypts_and_predicts_a_protected_release(updated):
    assert updated["pred1"]["version"] == "1.0.0"
    assert updated["pred1"]["outputs"]["y"]["data"] == [[1.0] * 4]
    m = updated["second"]["models"][0]
    assert (m["outcome"], m["via"], m["version"]) == ("updated", "patch", "2.0.0")
    assert updated["pred2"]["version"] == "2.0.0"
    assert updated["pred2"]["outputs"]["y"]["data"] == [[2.0] * 4]
    assert updated["pred2"]["outputs"]["wsum"]["data"] == pytest.approx(
        float(weights(23, tweak=8).sum()), rel=1e-5)
    # The manifest signs the sealed bytes: what the device reports is the served sha256.
    manifest = httpx.get(f"{updated['base']}/v1/channels/prod/manifest").json()
    doc = json.loads(__import__("base64").b64decode(manifest["payload"]))
    art = next(r for r in doc["models"]["clf"]["releases"] if r["version"] == "2.0.0")
    art = art["artifacts"][0]
    assert art["sealed"]["scheme"] == "mfseal1" and art["patches"]
    assert updated["pred2"]["sha256"] == art["sha256"] != art["sealed"]["plain_sha256"]


def test_bucket_and_device_hold_no_plaintext_weights(updated):
    blobs, device = updated["data"] / "blobs", updated["tmp"] / "edge-1"
    assert files_holding(blobs, CONTROL), "the control's weights must be found in the clear"
    assert files_holding(blobs, SECRET) == []
    assert files_holding(device, SECRET) == []
    store = BundleStore(device)
    bundle = store.active("clf")
    assert bundle is not None and bundle.members[0].at_rest
    # ...yet the device's sealed file does hold them, for the device-local key only.
    member = bundle.members[0]
    assert SECRET in read_plain(bundle.member_path(member), member, keystore_for(device))


def test_unenrolled_device_gets_no_content_key_and_installs_nothing(updated):
    code, out, err = _update(updated, "stranger", enrol=False)
    assert code == 2 and out["models"][0]["error"] == "ContentKeyError", (out, err)
    assert "device_unknown" in out["models"][0]["reason"]
    assert out["active"] == []
    assert files_holding(updated["tmp"] / "stranger", SECRET) == []


def test_device_not_offered_the_release_cannot_fetch_its_key(updated):
    client = updated["client"]
    _rollout(client, "clf", "1.0.0", channel="beta", percentage=0)  # offered to nobody
    with pytest.raises(ContentKeyError, match="release_not_offered"):
        _key_client(updated, "edge-1", "beta").content_key("clf", "1.0.0")
    # ...while on prod, where the rule offers it, the same device gets it.
    assert len(_key_client(updated, "edge-1", "prod").content_key("clf", "1.0.0")) == 32


def test_forged_key_request_signed_by_another_key_is_refused(updated):
    other = updated["tmp"] / "forger"
    (other / "identity").mkdir(parents=True, exist_ok=True)
    client = KeyClient(other, updated["base"], UrllibTransport(), "edge-1", "prod",
                       SystemClock(), 30)  # claims edge-1's id with its own key
    with pytest.raises(ContentKeyError, match="device_signature_invalid"):
        client.content_key("clf", "2.0.0")


def test_lost_local_key_is_a_typed_failure_not_a_crash(updated, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(updated["tmp"] / "edge-1", copy)
    (copy / "keys" / f"{AT_REST}.key").unlink()
    bundle = BundleStore(copy).active("clf")
    assert bundle is not None
    with pytest.raises(LocalKeyError):
        read_plain(bundle.member_path(bundle.members[0]), bundle.members[0], keystore_for(copy))


def test_revoked_device_gets_no_key_and_keeps_serving_its_model(updated):
    client = updated["client"]
    assert client.post("/v1/devices/edge-1/revoke").status_code == 200
    _upload(client, "clf", "3.0.0", weighted_model(3.0, weights(23, tweak=16)), protected=True)
    _rollout(client, "clf", "3.0.0")
    code, out, err = _update(updated, "edge-1")
    assert code == 2 and out["models"][0]["error"] == "ContentKeyError", (out, err)
    assert "device_revoked" in out["models"][0]["reason"]
    assert out["active"][0]["version"] == "2.0.0"
    pred = _predict(updated, "edge-1")
    assert pred["version"] == "2.0.0" and pred["outputs"]["y"]["data"] == [[2.0] * 4]


def test_first_install_came_through_the_sealed_compressed_copy(updated):
    # compress, then seal: the copy the manifest offers is sealed too (no plaintext weights
    # in the bucket, checked above), and the first install downloaded it, not the content.
    doc = json.loads(__import__("base64").b64decode(updated["manifest1"]["payload"]))
    (release,) = doc["models"]["clf"]["releases"]
    art = release["artifacts"][0]
    copy = art["compressed"]
    # FP32 weights: the copy is shuffled as 4-byte elements, then compressed, then sealed.
    assert copy["codec"] == "zstd-shuffle4" and copy["length"] < art["length"]
    sealed_copy = httpx.get(httpx.URL(updated["base"]).join(copy["url"])).content
    assert sealed_copy.startswith(b"MFSEAL1\n") and len(sealed_copy) == copy["length"]
    m = updated["first"]["models"][0]
    assert (m["via"], m["bytes"]) == ("full", copy["length"])
