"""`modelfleet device …` as a real subprocess against the simulator served over loopback HTTP."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.client.http_repo import serve
from tests.client.onnx_models import scaled_model
from tests.client.simulator import FakeClock, RepositorySimulator
from tests.support.signing import seeded_key

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "modelfleet", "device", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def served(tmp_path):
    sim = RepositorySimulator(FakeClock(time.time()))
    root = tmp_path / "root.json"
    root.write_bytes(sim.pinned_root)
    with serve(sim, redirect_blobs=True) as base:
        yield sim, base, root


def update_args(base: str, root: Path, data: Path, platform: str = "linux") -> list[str]:
    return ["update", "--server", base, "--channel", "prod", "--root", str(root),
            "--data-dir", str(data), "--device-id", "edge-7", "--platform", platform,
            "--os-version", "6.1", "--app-version", "1.0"]


def test_update_once_then_predict_prints_json(served, tmp_path):
    sim, base, root = served
    v1 = scaled_model(3.0)
    sim.publish("clf", [sim.release("1.0", [sim.artifact(v1)])])
    data = tmp_path / "device"
    first = cli(*update_args(base, root, data), "--once")
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert out["outcome"] == "updated"
    assert out["active"] == [{"model": "clf", "version": "1.0",
                              "sha256": hashlib.sha256(v1).hexdigest()}]
    assert json.loads(cli(*update_args(base, root, data), "--once").stdout)["outcome"] == (
        "up_to_date")

    x = np.ones((1, 4), dtype=np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    pred = cli("predict", "--data-dir", str(data), "--model", "clf", "--input",
               str(tmp_path / "x.npz"))
    assert pred.returncode == 0, pred.stderr
    body = json.loads(pred.stdout)
    assert body["version"] == "1.0" and body["outputs"]["y"]["data"] == [[3.0] * 4]


def test_predict_with_a_wrong_input_shape_keeps_onnxruntimes_whole_error(served, tmp_path):
    sim, base, root = served
    sim.publish("clf", [sim.release("1.0", [sim.artifact(scaled_model(3.0))])])
    data = tmp_path / "device"
    assert cli(*update_args(base, root, data), "--once").returncode == 0
    np.savez(tmp_path / "x.npz", x=np.ones((1, 5), dtype=np.float32))  # the model takes [1, 4]
    pred = cli("predict", "--data-dir", str(data), "--model", "clf", "--input",
               str(tmp_path / "x.npz"))
    assert pred.returncode == 2
    [line] = pred.stderr.strip().splitlines()  # one line, and all of it
    assert "index: 1 Got: 5 Expected: 4" in line, line


def test_verification_failure_exits_nonzero_with_one_line_and_keeps_the_model(served, tmp_path):
    sim, base, root = served
    sim.publish("clf", [sim.release("1.0", [sim.artifact(scaled_model(1.0))])])
    data = tmp_path / "device"
    assert cli(*update_args(base, root, data), "--once").returncode == 0
    sim.publish("clf", [sim.release("2.0", [sim.artifact(scaled_model(2.0))])])
    sim.sign_with = [seeded_key("attacker")]
    bad = cli(*update_args(base, root, data), "--once")
    assert bad.returncode == 1
    assert len(bad.stderr.strip().splitlines()) == 1 and "SignatureError" in bad.stderr
    out = json.loads(bad.stdout)
    assert out["outcome"] == "refused" and out["active"][0]["version"] == "1.0"


def test_expired_manifest_exits_1_and_the_json_still_names_trust_error(served, tmp_path):
    """Expiry is a MetadataExpiredError now; the agent's JSON keeps reporting "TrustError"."""
    sim, base, root = served
    sim.publish("clf", [sim.release("1.0", [sim.artifact(scaled_model(1.0))])])
    data = tmp_path / "device"
    assert cli(*update_args(base, root, data), "--once").returncode == 0
    sim.publish("clf", [sim.release("2.0", [sim.artifact(scaled_model(2.0))])], expires_in=-60)
    bad = cli(*update_args(base, root, data), "--once")
    assert bad.returncode == 1 and "ExpiredError" in bad.stderr
    out = json.loads(bad.stdout)
    assert (out["outcome"], out["error"], out["models"]) == ("refused", "TrustError", [])
    assert out["active"][0]["version"] == "1.0"


def test_tampered_artifact_exits_nonzero_and_keeps_the_model(served, tmp_path):
    sim, base, root = served
    sim.publish("clf", [sim.release("1.0", [sim.artifact(scaled_model(1.0))])])
    data = tmp_path / "device"
    assert cli(*update_args(base, root, data), "--once").returncode == 0
    v2 = scaled_model(2.0)
    art = sim.artifact(v2)
    sim.blobs["/" + art.url] = v2[:-4] + b"evil"
    sim.publish("clf", [sim.release("2.0", [art])])
    bad = cli(*update_args(base, root, data), "--once")
    assert bad.returncode == 1 and "sha256" in bad.stderr
    assert json.loads(bad.stdout)["active"][0]["version"] == "1.0"


def test_offer_for_another_platform_is_refused(served, tmp_path):
    sim, base, root = served
    sim.publish("clf", [sim.release("1.0", [sim.artifact(scaled_model(1.0))])])
    res = cli(*update_args(base, root, tmp_path / "d", platform="android"), "--once")
    out = json.loads(res.stdout)
    assert res.returncode == 0 and out["outcome"] == "refused" and out["active"] == []
    assert "includes this device" in out["reason"]


def test_polling_agent_stops_cleanly_on_sigterm(served, tmp_path):
    sim, base, root = served
    sim.publish("clf", [sim.release("1.0", [sim.artifact(scaled_model(1.0))])])
    proc = subprocess.Popen(
        [sys.executable, "-m", "modelfleet", "device", *update_args(base, root, tmp_path / "d"),
         "--interval", "0.2"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    first = json.loads(proc.stdout.readline())
    assert first["outcome"] == "updated"
    second = json.loads(proc.stdout.readline())  # it keeps polling
    assert second["outcome"] == "up_to_date"
    proc.send_signal(signal.SIGTERM)
    rest, _err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert json.loads(rest.strip().splitlines()[-1])["stopped"] is True


def test_native_library_output_on_fd1_does_not_corrupt_the_json_on_stdout():
    """QNN's HTP libraries print banners straight to fd 1; the agent moves them to stderr."""
    import subprocess
    import sys

    code = ("import os\n"
            "from modelfleet.device_cli import _keep_stdout_for_json\n"
            "_keep_stdout_for_json()\n"
            "os.write(1, b'LIBNATIVE: banner\\n')\n"
            "print('{\"ok\": true}')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout == '{"ok": true}\n'
    assert "LIBNATIVE: banner" in out.stderr


def test_shadow_candidate_through_the_agent_enrols_reports_and_fails(served, tmp_path):
    """`device update --enroll-token` enrols once and uploads; `device predict` answers with
    the active bundle and feeds the candidate, persisting its statistics before exiting."""
    from manifests import ShadowThresholds

    sim, base, root = served
    bad = scaled_model(3.0)
    sim.publish("clf", [
        sim.release("2.0", [sim.artifact(bad)], mode="shadow",
                    shadow=ShadowThresholds(1000, 1_000_000, min_samples=2)),
        sim.release("1.0", [sim.artifact(scaled_model(1.0))])])
    data = tmp_path / "device"
    token = sim.telemetry.token
    first = cli(*update_args(base, root, data), "--once", "--enroll-token", token)
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert out["active"][0]["version"] == "1.0"
    assert [(c["model"], c["version"], c["verdict"]) for c in out["candidates"]] == [
        ("clf", "2.0", "pending")]
    assert out["telemetry"]["enrolled"] and out["telemetry"]["status"] == "ok"
    assert list(sim.telemetry.keys) == ["edge-7"]

    x = np.array([[0.5, -1.0, 2.0, 0.25]], dtype=np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    for n in (1, 2):
        pred = cli("predict", "--data-dir", str(data), "--model", "clf", "--input",
                   str(tmp_path / "x.npz"))
        assert pred.returncode == 0, pred.stderr
        body = json.loads(pred.stdout)
        assert body["version"] == "1.0" and body["outputs"]["y"]["data"] == [x[0].tolist()]
        assert body["candidate"]["samples"] == n
    assert body["candidate"]["verdict"] == "failed"

    again = json.loads(cli(*update_args(base, root, data), "--once").stdout)
    assert [(c["version"], c["verdict"]) for c in again["candidates"]] == [("2.0", "failed")]
    assert again["telemetry"]["status"] == "ok"  # enrolled before: no token needed now
    summaries = {(r["samples"], r["verdict"]) for r in sim.telemetry.of_kind("shadow")}
    assert summaries == {(0, "pending"), (2, "failed")}


def test_agent_without_an_enrolment_token_still_updates(served, tmp_path):
    sim, base, root = served
    sim.publish("clf", [sim.release("1.0", [sim.artifact(scaled_model(1.0))])])
    run = cli(*update_args(base, root, tmp_path / "device"), "--once")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["active"][0]["version"] == "1.0"
    assert out["telemetry"]["status"] == "not_enrolled" and out["telemetry"]["pending"] >= 2
    assert sim.telemetry.bodies == []


@pytest.mark.parametrize("sr", [np.array(16000, np.int64), np.array([16000], np.int64)],
                         ids=["0-d", "one-element"])
def test_predict_feeds_a_scalar_input_and_prints_a_scalar_output(served, tmp_path, sr):
    """The voice-activity structure of issue 19 through the agent: a scalar int64 `sr` in
    (saved 0-d, or as a one-element array the runtime reshapes), a scalar probability out."""
    from server.compile import InputSpec
    from server.compile.shapes import specialize_file
    from server.compile.source import run_onnx_cpu
    from tests.compile.vad_model import vad_feeds, vad_onnx

    specs = (InputSpec("audio", (1, 64)), InputSpec("state", (2, 1, 16)),
             InputSpec("sr", (), "int64"))
    specialize_file(vad_onnx(tmp_path / "vad.onnx"), specs, tmp_path / "built.onnx")
    sim, base, root = served
    sim.publish("vad", [sim.release("1.0", [sim.artifact((tmp_path / "built.onnx")
                                                         .read_bytes())])])
    data = tmp_path / "device"
    assert cli(*update_args(base, root, data), "--once").returncode == 0
    feeds = {k: np.asarray(v[0]) for k, v in vad_feeds(1).items()}
    np.savez(tmp_path / "in.npz", audio=feeds["audio"], state=feeds["state"], sr=sr)
    pred = cli("predict", "--data-dir", str(data), "--model", "vad", "--input",
               str(tmp_path / "in.npz"))
    assert pred.returncode == 0, pred.stderr
    prob = json.loads(pred.stdout)["outputs"]["prob"]
    assert prob["shape"] == [] and prob["dtype"] == "float32"
    want = run_onnx_cpu(tmp_path / "vad.onnx", [feeds])[0][0]
    assert isinstance(prob["data"], float) and abs(prob["data"] - float(want)) < 1e-6


@pytest.fixture(scope="module")
def vad_builds(tmp_path_factory):
    """The VAD-structured model built by the compile pipeline for onnx and qnn (FP16 HTP)."""
    from server.compile import BuildSpec, InputSpec, Pipeline, SourceFormat
    from tests.compile.vad_model import vad_feeds, vad_onnx

    tmp = tmp_path_factory.mktemp("vad")
    np.savez(tmp / "ref.npz", **vad_feeds(2))
    specs = (InputSpec("audio", (1, 64)), InputSpec("state", (2, 1, 16)),
             InputSpec("sr", (), "int64"))
    spec = BuildSpec(vad_onnx(tmp / "vad.onnx"), SourceFormat.ONNX, {"default": specs},
                     platforms=("onnx", "qnn"), reference_path=tmp / "ref.npz",
                     settings={"numeric": {"fp16": {"min_snr_db": 35.0}}})
    out = {o.platform: o for o in Pipeline().build(spec, tmp / "work")}
    assert all(o.state == "ready" for o in out.values()), {p: o.error for p, o in out.items()}
    return tmp / "vad.onnx", out


def test_predict_on_the_htp_takes_the_scalar_through_the_agent(served, tmp_path, vad_builds):
    """The server-built QNN EPContext artifact of the VAD structure, installed by the agent
    on a QNN device (HTP emulated on x86), predicts with the scalar `sr`."""
    from server.compile.source import run_onnx_cpu
    from tests.compile.vad_model import vad_feeds

    source, out = vad_builds
    qnn, cpu = out["qnn"], out["onnx"]
    sim, base, root = served
    sim.publish("vad", [sim.release("1.0", [
        sim.artifact(qnn.artifact.path.read_bytes(), platform="qnn", fmt="onnx-epcontext",
                     variant=qnn.target["variant"],
                     target={"soc": "SM8650", "arch": "v75", "shape_variant": "default"}),
        sim.artifact(cpu.artifact.path.read_bytes(), platform="onnx", fmt="onnx",
                     variant="fp32", target={"shape_variant": "default"})])])
    data = tmp_path / "device"
    args = update_args(base, root, data, platform="qnn")
    upd = cli(*args, "--soc", "SM8650", "--arch", "v75", "--once")
    assert upd.returncode == 0, upd.stderr
    feeds = {k: np.asarray(v[0]) for k, v in vad_feeds(1, seed=7).items()}
    np.savez(tmp_path / "in.npz", **feeds)
    pred = cli("predict", "--data-dir", str(data), "--model", "vad", "--input",
               str(tmp_path / "in.npz"))
    assert pred.returncode == 0, pred.stderr
    body = json.loads(pred.stdout)
    assert body["backend"] == "onnxruntime-qnn", body
    prob = body["outputs"]["prob"]
    assert prob["shape"] == []
    want = float(run_onnx_cpu(source, [feeds])[0][0])
    assert abs(prob["data"] - want) < 1e-2  # FP16 on the HTP
