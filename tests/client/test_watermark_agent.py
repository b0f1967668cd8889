"""Per-cohort watermarks end to end (issue 23, docs/security.md): `modelfleet serve` in a
subprocess builds a watermarked ONNX version (4 cohorts, each gated), the manifest lists the
cohorts' copies beside cohort 0's artifact, two devices in different cohorts each download,
verify and predict their own copy through `modelfleet device update/predict`, and
`modelfleet watermark identify` names each device's cohort from the file it downloaded —
and "none" for the unmarked upload and for a foreign file."""

from __future__ import annotations

import base64
import io
import json
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from client_sdk import compression
from client_sdk.install import BundleStore
from manifests import cohort_of
from tests.client.test_protected_agent import _mf, _predict, _rollout, _update, served

__all__ = ["served"]  # the module fixture: one server for this file
pytestmark = pytest.mark.slow
COHORTS = 4
MODEL = "wm"


def matmul_model(seed: int, tweak: int = 0) -> bytes:
    """y = x @ W with a 256×256 W: 65,536 weights, 2,048 of them marked per cohort (the
    first `tweak` rows changed: a new version with a small delta)."""
    w = (np.random.default_rng(seed).standard_normal((256, 256)) / 16).astype(np.float32)
    w[:tweak] *= 1.5
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])],
        [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _devices() -> tuple[str, str]:
    """Two device ids in different cohorts of this model (the salt is the model's name)."""
    first = "edge-a"
    other = next(f"edge-{i}" for i in range(100)
                 if cohort_of(MODEL, f"edge-{i}", COHORTS) != cohort_of(MODEL, first, COHORTS))
    return first, other


def _identify(env: dict[str, Any], path: Path) -> tuple[int, dict[str, Any]]:
    done = _mf("watermark", "identify", str(path), "--data-dir", str(env["data"]), "--json")
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, dict(json.loads(done.stdout))


def _upload(client: httpx.Client, version: str, model: bytes, *, name: str = MODEL,
            platforms: tuple[str, ...] | list[str] = ("onnx",)) -> None:
    meta = {"version": version, "platforms": list(platforms),
            "watermark": {"cohorts": COHORTS},
            "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 256]}]}
    ref = _npz(x=np.random.default_rng(1).standard_normal((4, 1, 256)).astype(np.float32))
    r = client.post(f"/v1/models/{name}/versions",
                    files={"model": ("m.onnx", model), "reference": ("r.npz", ref)},
                    data={"metadata": json.dumps(meta)})
    assert r.status_code == 201, r.text
    for _ in range(480):
        got = client.get(f"/v1/models/{name}/versions/{version}").json()
        if got["state"] in ("ready", "failed"):
            break
        time.sleep(0.5)
    assert got["state"] == "ready", got
    _rollout(client, name, version)


@pytest.fixture(scope="module")
def marked(served: dict[str, Any]) -> dict[str, Any]:
    env, client = served, served["client"]
    assert client.post("/v1/models", json={"name": MODEL}).status_code == 201
    _upload(client, "1.0.0", matmul_model(3))
    devices = _devices()
    env["wm"] = {}
    for device in devices:
        code, out, err = _update(env, device, model=MODEL)
        assert code == 0, (out, err)
        bundle = BundleStore(env["tmp"] / device).active(MODEL)
        assert bundle is not None
        env["wm"][device] = {"out": out, "pred": _predict(env, device, MODEL, 256),
                             "file": bundle.member_path(bundle.members[0]),
                             "sha": bundle.members[0].sha256}
    return env


def test_devices_in_different_cohorts_get_different_artifacts_that_verify_and_predict(marked):
    doc = json.loads(base64.b64decode(
        httpx.get(f"{marked['base']}/v1/channels/prod/manifest").json()["payload"]))
    (art,) = doc["models"][MODEL]["releases"][0]["artifacts"]
    cohorts = art["cohorts"]
    assert cohorts["salt"] == MODEL and len(cohorts["artifacts"]) == COHORTS
    # Additive: an SDK that ignores `cohorts` takes cohort 0's copy.
    assert art["sha256"] == cohorts["artifacts"][0]["sha256"]
    shas = []
    x = np.ones((1, 256), dtype=np.float32)
    w = numpy_helper.to_array(onnx.load_from_string(matmul_model(3)).graph.initializer[0])
    for device, got in marked["wm"].items():
        c = cohort_of(MODEL, device, COHORTS)
        assert got["sha"] == cohorts["artifacts"][c]["sha256"], device
        assert got["pred"]["version"] == "1.0.0"
        y = np.asarray(got["pred"]["outputs"]["y"]["data"], dtype=np.float32)
        assert np.allclose(y, x @ w, rtol=1e-2, atol=1e-2)  # the marks barely move outputs
        shas.append(got["sha"])
    assert shas[0] != shas[1]


def test_identify_names_each_devices_cohort_from_its_downloaded_file(marked):
    for device, got in marked["wm"].items():
        code, found = _identify(marked, got["file"])
        assert code == 0, found
        assert found["cohort"] == cohort_of(MODEL, device, COHORTS), (device, found)
        assert (found["model"], found["version"]) == (MODEL, "1.0.0")
        assert found["false_positive"] <= 1e-9


def test_identify_names_the_cohort_of_a_compressed_leak(marked, tmp_path):
    # A leak as a compressed copy (what v1/artifacts serves newer SDKs, or a leaker's own
    # zstd): identify inflates it (capped) and names the same cohort.
    for device, got in marked["wm"].items():
        leak = tmp_path / f"{device}.onnx.zst"
        data = Path(got["file"]).read_bytes()
        with leak.open("wb") as out:
            compression.compress(io.BytesIO(data), out, len(data))
        code, found = _identify(marked, leak)
        assert code == 0 and found["cohort"] == cohort_of(MODEL, device, COHORTS), found


def test_next_version_reaches_each_cohort_as_a_patch_to_its_own_copy(marked):
    _upload(marked["client"], "2.0.0", matmul_model(3, tweak=4))
    for device in marked["wm"]:
        code, out, err = _update(marked, device, model=MODEL)
        assert code == 0, (out, err)
        m = out["models"][0]
        assert (m["outcome"], m["via"], m["version"]) == ("updated", "patch", "2.0.0"), m
        bundle = BundleStore(marked["tmp"] / device).active(MODEL)
        assert bundle is not None
        code, found = _identify(marked, bundle.member_path(bundle.members[0]))
        assert code == 0 and found["version"] == "2.0.0", found
        assert found["cohort"] == cohort_of(MODEL, device, COHORTS)


def test_identify_says_none_for_the_unmarked_upload_and_a_foreign_file(marked, tmp_path):
    unmarked = tmp_path / "unmarked.onnx"
    unmarked.write_bytes(matmul_model(3))
    foreign = tmp_path / "foreign.onnx"
    foreign.write_bytes(matmul_model(99))
    for path in (unmarked, foreign):
        code, found = _identify(marked, path)
        assert code == 1 and found["cohort"] is None, (path.name, found)


def test_identify_refuses_an_unreadable_file_with_the_reason(marked, tmp_path):
    junk = tmp_path / "leak.onnx"
    junk.write_bytes(b"QNNX" + bytes(200))
    out = _mf("watermark", "identify", str(junk), "--data-dir", str(marked["data"]))
    assert out.returncode == 2 and "neither an ONNX model nor an .mlpackage" in out.stderr


def test_a_qnn_release_ships_per_cohort_binaries_that_identify_names_as_downloaded(
        marked, tmp_path):
    # The QNN platform (FP16 on the HTP): each cohort's EPContext file is served; identify
    # names its cohort from the file as downloaded, and from its bare context binary.
    from server.compile.qnn_marks import context_binary

    client = marked["client"]
    assert client.post("/v1/models", json={"name": "wmq"}).status_code == 201
    _upload(client, "1.0.0", matmul_model(5), name="wmq", platforms=["qnn"])
    doc = json.loads(base64.b64decode(
        httpx.get(f"{marked['base']}/v1/channels/prod/manifest").json()["payload"]))
    (art,) = doc["models"]["wmq"]["releases"][0]["artifacts"]
    assert art["platform"] == "qnn" and len(art["cohorts"]["artifacts"]) == COHORTS
    for c in (0, COHORTS - 1):
        entry = art["cohorts"]["artifacts"][c]
        leak = tmp_path / f"c{c}.ctx.onnx"
        leak.write_bytes(httpx.get(httpx.URL(marked["base"]).join(entry["url"])).content)
        bare = tmp_path / f"c{c}.bin"
        bare.write_bytes(context_binary(leak))
        # Each cohort's compressed copy (the context binary's records and padding deflate)
        # is what a newer SDK downloads: identify reads it as it was served. Its FP16 weights
        # make it a shuffled copy, whose codec identify looks up by the copy's sha256.
        zipped = tmp_path / f"c{c}.ctx.onnx.zst"
        zipped.write_bytes(httpx.get(httpx.URL(marked["base"]).join(
            entry["compressed"]["url"])).content)
        assert entry["compressed"]["length"] < entry["length"]
        assert entry["compressed"]["codec"] in compression.SHUFFLED
        for path in (leak, bare, zipped):
            code, found = _identify(marked, path)
            assert code == 0 and found["cohort"] == c, (path.name, found)
            assert (found["model"], found["platform"]) == ("wmq", "qnn")
    junk = tmp_path / "junk.bin"  # a bare binary no artifact has the length of
    junk.write_bytes(b"QNNX" + bytes(200))
    code, found = _identify(marked, junk)
    assert code == 1 and found["cohort"] is None, found


def cancelling_model(seed: int) -> bytes:
    """y = x @ W1 − x @ W2 with W2 = 1.05·W1: outputs 1/20 of each product's, so one FP16
    step on 1/32 of the weights costs them ~26 dB more than on `matmul_model` — the
    compile marks a thinned share (or a plan), not every masked position."""
    w1 = (np.random.default_rng(seed).standard_normal((256, 256)) / 16).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W1"], ["a"]),
         helper.make_node("MatMul", ["x", "W2"], ["b"]),
         helper.make_node("Sub", ["a", "b"], ["y"])], "cancel",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w1 * 1.05, "W2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_identify_scores_a_thinned_mark_only_where_it_moved_weights(marked, tmp_path):
    """A thinned mark moves a share of the masked positions; identify reads which ones off a
    cohort's stored copy and scores only those (the rest add only noise: under 1% noise
    z falls by √share), and names the cohort from the file as downloaded."""
    from server.compile import weights

    client = marked["client"]
    assert client.post("/v1/models", json={"name": "wmthin"}).status_code == 201
    _upload(client, "1.0.0", cancelling_model(7), name="wmthin")
    (build,) = client.get("/v1/models/wmthin/versions/1.0.0/builds").json()
    gate = build["gates"]["watermark"]
    doc = json.loads(base64.b64decode(
        httpx.get(f"{marked['base']}/v1/channels/prod/manifest").json()["payload"]))
    (art,) = doc["models"]["wmthin"]["releases"][0]["artifacts"]
    leak = tmp_path / "c2.onnx"
    leak.write_bytes(httpx.get(httpx.URL(marked["base"]).join(
        art["cohorts"]["artifacts"][2]["url"])).content)
    upload = onnx.load_from_string(cancelling_model(7)).graph.initializer
    shipped = weights.by_name(weights.read(leak))
    moved = sum(int((shipped[t.name] != numpy_helper.to_array(t).reshape(-1)).sum())
                for t in upload)
    assert 0 < moved < gate["marked_weights"], gate  # thinned: fewer moved than masked
    code, found = _identify(marked, leak)
    assert code == 0 and found["cohort"] == 2, found
    assert found["weights_compared"] == moved, (found, gate)
