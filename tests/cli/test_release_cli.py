"""The release engineers' CLI against a real `modelfleet serve`, as scripts and outside
acceptance checks use it: MODELFLEET_SERVER / MODELFLEET_TOKEN from the environment, `--json`
printing exactly one document, exit codes of docs/cli.md (0 ok, 1 failed outcome, 2 usage,
3 refused by the server, 4 server or network failure, 5 wait timeout), errors on one stderr
line with the fix."""

from __future__ import annotations

import json
import os
import pty
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.cli.cli_support import (
    MODELFLEET,
    REPO,
    run_cli,
    write_reference,
    write_scale_model,
    write_unloadable_model,
)
from tests.support.served import free_port

Run = Callable[..., subprocess.CompletedProcess[str]]
INPUT = "x:float32:1x3x8x8"


def doc(result: subprocess.CompletedProcess[str]) -> dict:
    """The one JSON document on stdout (json.loads refuses a second one)."""
    return json.loads(result.stdout)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cli-files")
    return {"model": write_scale_model(d / "model.onnx"),
            "reference": write_reference(d / "ref.npz"),
            "bad": write_unloadable_model(d / "bad.onnx")}


def publish(mf: Run, model: str, version: str, path: Path, *extra: str, **env: str
            ) -> subprocess.CompletedProcess[str]:
    return mf("publish", model, str(path), "--version", version, "--platform", "onnx",
              "--input", INPUT, *extra, **env)


def test_publish_wait_then_rollout_start_ramp_status_halt_as_json(mf: Run, files) -> None:
    created = mf("models", "create", "scaler", "--task", "other", "--json")
    assert created.returncode == 0, created.stderr
    assert doc(created)["name"] == "scaler"
    assert mf("models", "create", "scaler", "--task", "other").returncode == 0  # idempotent

    published = publish(mf, "scaler", "1.0.0", files["model"], "--reference",
                        str(files["reference"]), "--wait", "--json")
    assert published.returncode == 0, published.stderr
    version = doc(published)
    assert (version["model"], version["version"], version["state"]) == ("scaler", "1.0.0",
                                                                         "ready")
    [build] = version["builds"]
    assert build["platform"] == "onnx" and build["state"] == "succeeded"
    assert build["gates"]["numeric"]["passed"] is True and build["artifact"]["sha256"]
    assert published.stderr == ""  # a pipe: no progress bar, no live table

    started = mf("rollout", "start", "prod", "scaler", "1.0.0", "--percent", "5", "--json")
    assert started.returncode == 0, started.stderr
    rollout = doc(started)
    rid = str(rollout["id"])
    assert (rollout["percentage"], rollout["state"], rollout["channel"]) == (5.0, "active",
                                                                             "prod")
    ramped = doc(mf("rollout", "ramp", rid, "--percent", "50", "--json"))
    assert ramped["id"] == rollout["id"] and ramped["percentage"] == 50.0
    assert ramped["serial"] > rollout["serial"]
    status = mf("rollout", "status", rid, "--json")
    assert status.returncode == 0 and doc(status)["percentage"] == 50.0

    live = doc(mf("status", "--json"))
    prod = next(c for c in live["channels"] if c["name"] == "prod")
    assert [r["id"] for r in prod["live"]] == [rollout["id"]]
    assert prod["serial"] == ramped["serial"]
    listed = doc(mf("rollout", "list", "prod", "--json"))
    assert [r["id"] for r in listed["rollouts"]] == [rollout["id"]]

    halted = mf("rollout", "halt", rid, "--reason", "bad numbers", "--json")
    assert halted.returncode == 0, halted.stderr
    assert doc(halted)["state"] == "halted" and doc(halted)["serial"] > ramped["serial"]
    assert doc(mf("rollout", "halt", rid, "--json"))["serial"] is None  # a no-op
    assert doc(mf("rollout", "status", rid, "--json"))["state"] == "halted"
    assert next(c for c in doc(mf("status", "--json"))["channels"]
                if c["name"] == "prod")["live"] == []
    events = doc(mf("audit", "--action", "rollout.halt", "--json"))["events"]
    assert events[0]["target"] == "prod/scaler/1.0.0"
    # A halt is not final: an operator resumes it, with a reason.
    refused = mf("rollout", "resume", rid, "--json")
    assert refused.returncode != 0 and "needs a reason" in refused.stderr, refused.stderr
    resumed = mf("rollout", "resume", rid, "--reason", "numbers explained", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert doc(resumed)["state"] == "active" and doc(resumed)["serial"] > doc(halted)["serial"]
    assert doc(resumed)["state_reason"] == "numbers explained"


def test_human_output_of_versions_rollouts_and_status(mf: Run, files) -> None:
    assert mf("models", "create", "human").returncode == 0
    assert publish(mf, "human", "1.0.0", files["model"], "--wait").returncode == 0
    shown = mf("versions", "show", "human", "1.0.0")
    assert shown.returncode == 0
    assert "human 1.0.0: ready" in shown.stdout
    assert "onnx · shape variant default · succeeded" in shown.stdout
    assert "build variant fp32" in shown.stdout
    assert "not run: the version has no reference" in shown.stdout  # the reason, not "not_run"
    listed = mf("versions", "list", "human")
    assert "1.0.0" in listed.stdout and "ready" in listed.stdout
    started = mf("rollout", "start", "beta", "human", "1.0.0", "--percent", "100",
                 "--filter", "platform=onnx")
    assert started.returncode == 0, started.stderr
    assert "on beta at 100%, active [platforms=onnx], manifest serial" in started.stdout
    assert "beta: manifest serial" in mf("status").stdout
    assert "human" in mf("models", "list").stdout


def test_a_failed_build_exits_1_after_the_report(mf: Run, files) -> None:
    assert mf("models", "create", "broken").returncode == 0
    failed = publish(mf, "broken", "1.0.0", files["bad"], "--reference",
                     str(files["reference"]), "--wait", "--json")
    assert failed.returncode == 1
    report = doc(failed)  # still exactly one document: the report
    assert report["state"] == "failed" and report["builds"][0]["state"] == "failed"
    assert "Frobnicate" in report["builds"][0]["error"]
    assert "fix: see `modelfleet versions show broken 1.0.0`" in one_line_error(failed)
    assert mf("versions", "show", "broken", "1.0.0").returncode == 1


def test_refused_requests_exit_3_with_the_servers_fix(mf: Run, files) -> None:
    missing = mf("rollout", "ramp", "4242", "--percent", "5", "--json")
    assert missing.returncode == 3
    line = one_line_error(missing)
    assert "no rollout with id 4242 (HTTP 404)" in line and "(fix: " in line
    assert doc(missing)["error"]["code"] == "rollout_not_found"
    unknown = mf("audit", MODELFLEET_TOKEN="mf_not_a_real_token")
    assert unknown.returncode == 3 and "unknown API token (HTTP 401)" in one_line_error(unknown)
    shadow = mf("rollout", "start", "prod", "scaler", "1.0.0", "--percent", "1", "--mode",
                "shadow")
    assert shadow.returncode == 3 and "shadow thresholds" in one_line_error(shadow)
    upload = publish(mf, "no-such-model", "1.0.0", files["model"])
    assert upload.returncode == 3 and "(HTTP 404)" in one_line_error(upload)
    denied = publish(mf, "scaler", "9.0.0", files["model"], MODELFLEET_TOKEN="")
    assert denied.returncode == 3 and "HTTP 401" in one_line_error(denied)


def test_rollout_start_with_a_ramp_schedule_shows_it_and_refuses_bad_ones(mf: Run) -> None:
    # scaler 1.0.0 was published by the first test of this module; a new channel here.
    started = mf("rollout", "start", "canary", "scaler", "1.0.0", "--ramp", "1,5,25,100",
                 "--ramp-interval", "1h", "--json")
    assert started.returncode == 0, started.stderr
    rollout = doc(started)
    assert rollout["percentage"] == 1.0
    ramp = rollout["ramp"]
    assert (ramp["steps"], ramp["interval_seconds"], ramp["step"], ramp["state"]) == (
        [1.0, 5.0, 25.0, 100.0], 3600, 1, "scheduled")
    assert ramp["next_step_at"]
    shown = mf("rollout", "status", str(rollout["id"]))
    assert "ramp 1% → 5% → 25% → 100% every 3600 s: step 1/4, scheduled, next step at" \
        in " ".join(shown.stdout.split())
    refused = mf("rollout", "start", "canary2", "scaler", "1.0.0", "--ramp", "5,1",
                 "--ramp-interval", "30m")
    assert refused.returncode == 3 and "not strictly increasing" in one_line_error(refused)
    disagree = mf("rollout", "start", "canary2", "scaler", "1.0.0", "--percent", "2",
                  "--ramp", "1,100", "--ramp-interval", "90s")
    assert disagree.returncode == 3 and "disagrees" in one_line_error(disagree)
    for usage in (["--ramp", "1,100"], ["--ramp", "1,100", "--ramp-interval", "soon"],
                  ["--ramp", "1,lots", "--ramp-interval", "1h"], []):
        bad = mf("rollout", "start", "canary2", "scaler", "1.0.0", *usage)
        assert bad.returncode == 2, (usage, bad.stderr)
        assert "(fix: e.g. " in one_line_error(bad)


def test_an_unreachable_server_exits_4(mf: Run) -> None:
    gone = mf("models", "list", "--json", MODELFLEET_SERVER=f"http://127.0.0.1:{free_port()}")
    assert gone.returncode == 4
    assert "cannot reach" in one_line_error(gone) and "--server" in gone.stderr
    assert "error" in doc(gone)


def test_usage_errors_exit_2_before_any_request(mf: Run, files) -> None:
    bad_input = publish(mf, "scaler", "2.0.0", files["model"], "--input", "x:float32")
    assert bad_input.returncode == 2
    assert "NAME:DTYPE:SHAPE" in one_line_error(bad_input)
    assert mf("rollout", "ramp", "1", "--percent", "150").returncode == 2
    assert mf("rollout", "ramp", "1", "--percent", "lots").returncode == 2
    assert mf("rollout", "start", "prod", "scaler", "1.0.0", "--percent", "1",
              "--filter", "colour=red").returncode == 2
    missing = mf("publish", "scaler", "nope.onnx", "--version", "2.0.0", "--platform", "onnx",
                 "--input", INPUT)
    assert missing.returncode == 2 and "no such file" in one_line_error(missing)


def test_wait_given_a_value_says_it_is_a_switch(mf: Run, files) -> None:
    r = publish(mf, "scaler", "2.0.0", files["model"], "--wait", "true")
    assert r.returncode == 2
    assert "--wait is a switch and takes no value" in " ".join(r.stderr.split())


def test_wait_timeout_exits_5_with_the_state_so_far(mf: Run, files) -> None:
    r = publish(mf, "scaler", "3.0.0", files["model"], "--wait", "--timeout", "0", "--json")
    assert r.returncode == 5
    body = doc(r)
    assert body["error"]["code"] == "timeout" and body["version"]["version"] == "3.0.0"
    assert "--timeout" in one_line_error(r)


def test_preview_and_devices(mf: Run, served, tmp_path: Path) -> None:
    now = datetime.now(UTC).isoformat(" ")
    with sqlite3.connect(served.data / "modelfleet.db") as db:
        db.execute("INSERT INTO devices (id, profile, first_seen_at, last_seen_at) "
                   "VALUES (?, ?, ?, ?)",
                   ("edge-9", json.dumps({"platform": "onnx", "soc": "x1"}), now, now))
    seen = doc(mf("devices", "--json"))["devices"]
    assert [d["id"] for d in seen] == ["edge-9"] and seen[0]["profile"]["soc"] == "x1"
    assert "edge-9" in mf("devices").stdout
    profiles = tmp_path / "devices.json"
    profiles.write_text(json.dumps([{"device_id": f"d{i}", "platform": "onnx"}
                                    for i in range(200)]))
    preview = mf("rollout", "preview", "beta", "--model", "human", "--version", "1.0.0",
                 "--percent", "50", "--devices", str(profiles), "--json")
    assert preview.returncode == 0, preview.stderr
    body = doc(preview)
    assert body["total"] == 200 and 60 < body["included"] < 140


def test_login_stores_the_token_0600_and_later_commands_use_it(served, tmp_path: Path) -> None:
    config = tmp_path / "cfg" / "config.json"
    env = {k: v for k, v in served.env().items() if k != "MODELFLEET_TOKEN"}
    env["MODELFLEET_CONFIG"] = str(config)
    refused = run_cli("login", "--server", served.base, "--token", "mf_wrong", env=env)
    assert refused.returncode == 3 and not config.exists()
    login = run_cli("login", "--server", served.base, env=env, stdin=served.token + "\n")
    assert login.returncode == 0, login.stderr
    assert served.token not in login.stdout + login.stderr  # shown masked only
    assert served.token[:8] + "…" in login.stdout
    assert config.stat().st_mode & 0o777 == 0o600
    assert json.loads(config.read_text()) == {"server": served.base, "token": served.token}
    env.pop("MODELFLEET_SERVER")
    audit = run_cli("audit", "--json", env=env)  # needs a token: it came from the file
    assert audit.returncode == 0, audit.stderr


def test_progress_is_drawn_on_a_terminal_only(served, files) -> None:
    """On a terminal (stderr a pty) publish --wait draws the upload bar and the live build
    table; the pipe runs above leave stderr empty."""
    assert run_cli("models", "create", "tty", env=served.env()).returncode == 0
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [*MODELFLEET, "publish", "tty", str(files["model"]), "--version", "1.0.0",
         "--platform", "onnx", "--input", INPUT, "--wait"], cwd=REPO,
        env=served.env(COLUMNS="100"), stdout=subprocess.PIPE, stderr=secondary)
    os.close(secondary)
    drawn = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        drawn += chunk
    out, _ = proc.communicate(timeout=300)
    os.close(primary)
    assert proc.returncode == 0
    screen = drawn.decode(errors="replace")
    assert "uploading model.onnx" in screen or "compiling" in screen
    assert "shape variant" in screen  # the live per-platform table
    assert b"tty 1.0.0: ready" in out  # the report itself goes to stdout


def test_root_probe_404_stays_out_of_the_access_log(served) -> None:
    with pytest.raises(urllib.error.HTTPError) as probe:
        urllib.request.urlopen(f"{served.base}/v1/root/99.json", timeout=10)
    assert probe.value.code == 404
    with urllib.request.urlopen(f"{served.base}/v1/models?limit=7", timeout=10):
        pass
    deadline = time.monotonic() + 10
    while "/v1/models?limit=7" not in served.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    log = served.log.read_text()
    assert "GET /v1/models?limit=7" in log  # the access log is on…
    assert "/v1/root/99.json" not in log  # …and the normal "no newer root" answer not in it


def test_publish_with_model_data_uploads_an_onnx_whose_weights_are_kept_beside_it(
        mf: Run, tmp_path: Path) -> None:
    import onnx

    model = onnx.load(str(write_scale_model(tmp_path / "single.onnx", scale=3.0)))
    onnx.save_model(model, str(tmp_path / "model.onnx"), save_as_external_data=True,
                    location="model.onnx.data", size_threshold=0)
    assert mf("models", "create", "split", "--task", "other").returncode == 0
    alone = publish(mf, "split", "1.0.0", tmp_path / "model.onnx")
    assert alone.returncode == 3 and "--model-data" in one_line_error(alone), alone.stderr

    published = publish(mf, "split", "1.0.0", tmp_path / "model.onnx", "--model-data",
                        str(tmp_path / "model.onnx.data"), "--wait", "--json")
    assert published.returncode == 0, published.stderr
    assert doc(published)["state"] == "ready"
    missing = publish(mf, "split", "1.0.1", tmp_path / "model.onnx", "--model-data",
                      str(tmp_path / "nope.data"))
    assert missing.returncode == 2 and "--model-data" in one_line_error(missing)
