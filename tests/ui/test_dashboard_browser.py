"""The dashboard in a real browser: Debian's chromium driven by Playwright against the real
server on loopback (uvicorn, SQLite, signing keys), seeded with a model, a ready version with
gate reports, a rollout and signed telemetry from enrolled devices.

It opens the rollout page, sees the charts' SVG drawn with data points, pastes a token,
halts the rollout through the confirm dialog and sees the manifest serial change on the page
and in the API; on a second rollout seeded with a ramp schedule it sees the steps and the next
step time, ramps by hand and sees share, serial and the schedule's state change; a version's
failed delta-patch job shows its state, count and error — and a halt reason / model
description / patch error made of markup stays text (stored XSS). Saves
artifacts/ui-rollout.png (the CI artifact).

Chromium missing: a skip on a dev box, a failure under CI (MODELFLEET_REQUIRE_POSTGRES=1 or
CI=true), so the case cannot silently vanish there."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from server.app import create_app
from server.auth import create_token
from server.blobstore import LocalBlobStore
from server.db import models as db
from server.db.states import PatchJobState
from tests.fleet.conftest import fleet_settings
from tests.publish.conftest import version_maker
from tests.support.fleet_devices import FleetDevice, shadow_report, update_report
from tests.support.served import free_port

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "artifacts" / "ui-rollout.png"
XSS = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
PATCH_ERROR = "bsdiff4: <b>out of memory</b> making the patch from 1.0"


def chromium_or_skip() -> str:
    path = shutil.which("chromium")
    if path is None:
        if os.environ.get("MODELFLEET_REQUIRE_POSTGRES") == "1" or os.environ.get("CI") == "true":
            pytest.fail("chromium is missing (CI needs it: apt-get install chromium, or "
                        "scripts/setup with the dev extra as root)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return path


@dataclass
class Served:
    base: str
    client: httpx.Client
    ops: dict[str, str]
    token: str
    rollout_id: int
    ramped_id: int  # on channel canary, with a ramp schedule


def _serve(app: Any) -> tuple[uvicorn.Server, threading.Thread, int]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    return server, thread, port


def _seed_version(factory: Any, settings: Any, model: str, version: str) -> None:
    """A ready version as the compile pipeline leaves it: source upload, metadata, a
    succeeded build per platform with its gate report, artifacts."""
    version_maker(factory, LocalBlobStore(settings.resolved_blob_dir))(model, version)
    with factory() as s:
        v = s.query(db.ModelVersion).filter_by(version=version).one()
        v.metadata_json = {"platforms": {"android": {}, "ios": {}},
                           "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 4]}],
                           "variants": [""], "notes": ""}
        s.add(db.SourceUpload(version_id=v.id, kind=db.UploadKind.model, filename="m.onnx",
                              format="onnx", sha256="ab" * 32, length=4096, blob_key="x"))
        for platform in ("android", "ios"):
            s.add(db.Build(version_id=v.id, platform=platform, variant="",
                           state=db.BuildState.succeeded, attempts=1, gates_report={
                               "outcomes": [{"variant": "", "platform": platform,
                                             "precision": "fp16", "state": "ready",
                                             "layer_diff": _layer_diff(platform), "gates": {
                                   "operators": {"passed": True, "unsupported": []},
                                   "numeric": {"max_abs_diff": 0.0003, "passed": True}}}]}))
        s.commit()


LAYERS = [("conv0", "Conv"), ("relu0", "Relu"), (XSS, "Conv"), ("head", "Gemm")]


def _layer_diff(platform: str) -> dict[str, Any]:
    """A per-layer diff as the pipeline stores it (gates/layerdiff.py); on "ios" the third
    layer (named with markup) falls below the FP16 thresholds."""
    rows = [[f"t{i}", node, op, 1.0, 70.0 - i] for i, (node, op) in enumerate(LAYERS)]
    first = None
    if platform == "ios":
        rows[2][3:] = [0.99, 12.5]
        first = {"node": XSS, "op": "Conv", "tensor": "t2", "cosine": 0.99, "snr_db": 12.5,
                 "max_abs_diff": 0.4, "index": 2}
    return {"basis": "the FP32 source vs the artifact", "precision": "fp16",
            "thresholds": {"min_cosine": 0.999, "min_snr_db": 60.0}, "total": 4,
            "truncated": False, "fields": ["tensor", "node", "op", "cosine", "snr_db"],
            "layers": rows, "first_below": first}


def _seed_failed_patch_job(factory: Any, version: str) -> None:
    """The version's delta-patch job as the runner leaves it after its last failed attempt
    (settled: nothing claims it again until a rollout asks)."""
    with factory() as s:
        v = s.query(db.ModelVersion).filter_by(version=version).one()
        s.add(db.PatchJob(version_id=v.id, state=PatchJobState.failed, attempts=3,
                          patches_added=0, error=PATCH_ERROR))
        s.commit()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp_path = tmp_path_factory.mktemp("dashboard")
    settings = fleet_settings(f"sqlite:///{tmp_path / 'ui.db'}", tmp_path)
    app = create_app(settings)
    server, thread, port = _serve(app)
    base = f"http://127.0.0.1:{port}"
    try:
        factory = app.state.session_factory
        with factory() as s:
            _, ops = create_token(s, ["publish", "rollout"], name="ops")
            _, enroll = create_token(s, ["enroll"], name="devices")
            s.commit()
        auth = {"Authorization": f"Bearer {ops}"}
        with httpx.Client(base_url=base, timeout=10) as client:
            r = client.post("/v1/models", headers=auth, json={
                "name": "clf", "description": XSS, "task": "classification"})
            assert r.status_code == 201, r.text
            _seed_version(factory, settings, "clf", "1.0")
            r = client.post("/v1/channels/prod/rollouts", headers=auth, json={
                "model": "clf", "version": "1.0", "percentage": 100, "shadow": {
                    "max_kl_micro": 5_000, "max_latency_p99_us": 8_000, "min_samples": 10}})
            assert r.status_code == 201, r.text
            rollout_id = r.json()["id"]
            _send_telemetry(client, enroll)
            _seed_version(factory, settings, "clf", "2.0")
            _seed_failed_patch_job(factory, "2.0")
            # A schedule an hour per step: nothing steps it during the test.
            r = client.post("/v1/channels/canary/rollouts", headers=auth, json={
                "model": "clf", "version": "1.0",
                "ramp": {"steps": [5, 25, 100], "interval_seconds": 3600}})
            assert r.status_code == 201, r.text
            yield Served(base, client, auth, ops, rollout_id, r.json()["id"])
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _send_telemetry(client: httpx.Client, enroll: str) -> None:
    for i in range(6):
        if i == 3:
            time.sleep(1.2)  # a second wave, a later bucket: the adoption line climbs
        device = FleetDevice(f"pixel-{i:03d}", platform=("android", "ios")[i % 2])
        r = client.post("/v1/devices/enroll", json=device.enroll_body(),
                        headers={"Authorization": f"Bearer {enroll}"})
        assert r.status_code == 201, r.text
        via, size = ("patch", 40_000) if i % 3 else ("full", 400_000)
        reports = [update_report("clf", "1.0", "downloaded") | {"via": via, "bytes": size},
                   update_report("clf", "1.0", "activated") | {"via": "held", "bytes": 0},
                   shadow_report("clf", "1.0", "failed" if i == 5 else "passed",
                                 kl=9_000 if i == 5 else 800 + 300 * i,  # its figures fail
                                 candidate_p99=2_000 + 500 * i)]
        body = device.batch(reports)
        r = client.post("/v1/telemetry", content=body, headers=device.headers(body))
        assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    executable = chromium_or_skip()
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=executable)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any, served: Served) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 1100})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{served.base}/ui/#/models")
    page.fill("#token-input", served.token)
    page.click("#token-save")
    yield page
    context.close()
    assert errors == []  # no script error on any page the test opened


def _serial(served: Served, channel: str) -> int:
    channels = served.client.get("/v1/channels", headers=served.ops).json()
    serial: int = next(c["serial"] for c in channels if c["name"] == channel)
    return serial


def test_rollout_page_needs_a_token_and_keeps_it_out_of_the_url(browser: Any,
                                                                served: Served) -> None:
    from playwright.sync_api import expect

    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{served.base}/ui/#/rollouts/{served.rollout_id}")
        # Without a token the rollout reads are refused: the page says what to do.
        expect(page.locator("#status")).to_contain_text("needs an API token")
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.fill("#token-input", served.token)
        page.click("#token-save")
        expect(page.locator("#manifest-serial")).to_have_text(str(_serial(served, "prod")))
        assert page.evaluate("sessionStorage.getItem('modelfleet.token')") == served.token
        assert page.evaluate("localStorage.length") == 0
        assert requests and not any(served.token in url for url in [page.url, *requests])
    finally:
        context.close()


def test_rollout_page_charts_then_halt_with_a_token_changes_the_serial(page: Any,
                                                                       served: Served) -> None:
    from playwright.sync_api import expect

    serial_before = _serial(served, "prod")
    page.goto(f"{served.base}/ui/#/rollouts/{served.rollout_id}")
    serial = page.locator("#manifest-serial")
    expect(serial).to_have_text(str(serial_before))
    adoption = page.locator("svg[data-chart=adoption] circle.point")
    expect(adoption.first).to_be_attached()
    last = adoption.last.locator("title").text_content() or ""
    assert last.endswith(": 6"), last  # six devices activated
    expect(page.locator("svg[data-chart=bytes] rect.bar.s-patch").first).to_be_attached()
    expect(page.locator("svg[data-chart=bytes] rect.bar.s-full").first).to_be_attached()
    expect(page.locator("svg[data-chart=shadow] rect.bar.s-fail")).to_have_count(1)
    expect(page.locator("svg[data-chart=divergence] line.limit")).to_have_count(1)
    expect(page.locator("[data-count=passed]")).to_have_text("5")
    expect(page.locator("[data-count=failed]")).to_have_text("1")
    expect(page.locator("#ramp-schedule")).to_have_count(0)  # started without a schedule

    page.fill("#halt-reason", "divergence on pixel-005")
    page.click("#halt")
    expect(page.locator("#confirm-dialog")).to_be_visible()
    page.click("#confirm-ok")
    expect(serial).not_to_have_text(str(serial_before))
    shown = int(serial.text_content() or "0")
    assert shown > serial_before and shown == _serial(served, "prod")
    state = served.client.get(f"/v1/rollouts/{served.rollout_id}", headers=served.ops).json()
    assert state["state"] == "halted" and state["state_reason"] == "divergence on pixel-005"
    expect(page.locator("#status")).to_contain_text(f"serial {shown}")
    expect(page.locator("#state-reason")).to_have_text("divergence on pixel-005")
    expect(page.locator("#halt")).to_be_disabled()  # halted: only a resume is left
    expect(page.locator("#ramp")).to_be_disabled()
    SCREENSHOT.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)

    # An operator resumes the halt: a reason is required, a new manifest is signed.
    expect(page.locator("#resume")).to_be_enabled()
    page.fill("#halt-reason", "the divergence was a bad test device")
    page.click("#resume")
    page.click("#confirm-ok")
    expect(serial).not_to_have_text(str(shown))
    state = served.client.get(f"/v1/rollouts/{served.rollout_id}", headers=served.ops).json()
    assert (state["state"], state["percentage"]) == ("active", 100.0), state
    assert state["state_reason"] == "the divergence was a bad test device"
    [event] = served.client.get("/v1/audit", params={"action": "rollout.resume"},
                                headers=served.ops).json()["events"]
    assert event["details"]["reason"] == "the divergence was a bad test device"
    assert event["details"]["from"] == "halted"
    expect(page.locator("#halt")).to_be_enabled()


def test_ramp_schedule_shows_its_steps_then_a_manual_ramp_takes_over(page: Any,
                                                                     served: Served) -> None:
    from playwright.sync_api import expect

    rid = served.ramped_id
    before = served.client.get(f"/v1/rollouts/{rid}", headers=served.ops).json()["ramp"]
    assert before["state"] == "scheduled" and before["step"] == 1, before
    serial_before = _serial(served, "canary")
    page.goto(f"{served.base}/ui/#/rollouts/{rid}")
    serial = page.locator("#manifest-serial")
    expect(serial).to_have_text(str(serial_before))
    expect(page.locator("#share")).to_have_text("5%")
    steps = page.locator("#ramp-schedule ol.steps li")
    expect(steps).to_have_text(["5%", "25%", "100%"])
    current = page.locator("#ramp-schedule li[aria-current=step]")
    expect(current).to_have_text("5%")
    expect(current).to_have_class("step current")
    expect(page.locator("#ramp-state")).to_have_text("scheduled")
    due = datetime.fromisoformat(before["next_step_at"]).strftime("%Y-%m-%d %H:%M:%SZ")
    expect(page.locator("#ramp-next")).to_have_text(due)
    expect(page.locator("#ramp-schedule")).to_contain_text("every 1 h")
    SCREENSHOT.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT.with_name("ui-ramp.png")), full_page=True)

    page.fill("#ramp-percentage", "40")
    page.click("#ramp")
    expect(page.locator("#confirm-dialog")).to_be_visible()
    page.click("#confirm-ok")
    expect(page.locator("#share")).to_have_text("40%")
    expect(serial).not_to_have_text(str(serial_before))
    shown = int(serial.text_content() or "0")
    assert shown > serial_before and shown == _serial(served, "canary")
    expect(page.locator("#status")).to_contain_text(f"Ramp: signed manifest serial {shown}")
    # The person's share stands: the server clears the remaining steps.
    expect(page.locator("#ramp-state")).to_have_text("taken_over")
    expect(page.locator("#ramp-next")).to_have_text("–")
    expect(current).to_have_count(0)  # the share (40%) is no step's
    expect(page.locator("#ramp-schedule li.cleared")).to_have_text(["25%", "100%"])
    after = served.client.get(f"/v1/rollouts/{rid}", headers=served.ops).json()
    assert after["percentage"] == 40 and after["ramp"]["state"] == "taken_over", after
    assert after["ramp"]["next_step_at"] is None


def test_stored_xss_via_model_description_and_audit_reason_renders_as_text(
        page: Any, served: Served) -> None:
    """Markup stored in a model description and in a halt reason (the audit log, the
    rollout's state reason) is shown as its literal text: no element is made of it and none
    of its script runs."""
    from playwright.sync_api import expect

    r = served.client.post("/v1/channels/beta/rollouts", headers=served.ops, json={
        "model": "clf", "version": "1.0", "percentage": 10})
    assert r.status_code == 201, r.text
    beta = r.json()["id"]
    r = served.client.post(f"/v1/rollouts/{beta}/halt", headers=served.ops, json={"reason": XSS})
    assert r.status_code == 200, r.text
    page.goto(f"{served.base}/ui/#/models/clf")
    expect(page.locator(".description")).to_have_text(XSS)
    page.goto(f"{served.base}/ui/#/audit")
    expect(page.locator("table.audit")).to_contain_text("rollout.halt")
    expect(page.locator("table.audit")).to_contain_text(XSS)
    page.goto(f"{served.base}/ui/#/channels")
    expect(page.locator("main")).to_contain_text(XSS)
    page.goto(f"{served.base}/ui/#/rollouts/{beta}")
    expect(page.locator("#state-reason")).to_have_text(XSS)
    assert page.locator("main img, main script").count() == 0
    assert page.evaluate("window.__pwned === undefined")


def test_version_page_shows_builds_with_their_gate_reports(page: Any, served: Served) -> None:
    from playwright.sync_api import expect

    page.goto(f"{served.base}/ui/#/models/clf/versions/1.0")
    expect(page.locator("section.card")).to_have_count(2)  # android, ios
    expect(page.locator("dl.gates").first).to_contain_text("max_abs_diff")
    expect(page.locator("h1 .badge")).to_have_text("ready")


def test_version_page_shows_the_per_layer_diff_as_a_heatmap(page: Any, served: Served) -> None:
    from playwright.sync_api import expect

    api = served.client.get("/v1/models/clf/versions/1.0/layers?limit=2").json()
    assert api["total"] == 4 and api["next_offset"] == 2 and len(api["layers"]) == 2
    page.goto(f"{served.base}/ui/#/models/clf/versions/1.0")
    heat = page.locator("#layer-heatmap")
    expect(heat.locator("thead th.heat-col")).to_have_count(2)  # android, ios
    expect(heat.locator("tbody tr")).to_have_count(4)  # layers × platform/precision
    expect(heat.locator("td.heat")).to_have_count(8)
    expect(heat.locator("td.heat.below")).to_have_count(1)  # the ios cell of layer 3
    expect(heat.locator("td.heat.below")).to_have_text("13")
    expect(heat.locator("td.heat-4").first).to_be_visible()
    expect(page.locator("#layer-diff code.first-below")).to_have_text(XSS)  # text, not markup
    assert page.evaluate("window.__pwned") is None
    page.screenshot(path=str(SCREENSHOT.with_name("ui-layers.png")), full_page=True)


def test_version_page_shows_a_failed_patch_job_with_its_error_as_text(page: Any,
                                                                       served: Served) -> None:
    from playwright.sync_api import expect

    api = served.client.get("/v1/models/clf/versions/2.0").json()["patches"]
    assert api == {"state": "failed", "patches": 0, "attempts": 3, "error": PATCH_ERROR}, api
    page.goto(f"{served.base}/ui/#/models/clf/versions/2.0")
    expect(page.locator("#patches-state")).to_have_text("failed")
    expect(page.locator("#patches-count")).to_have_text("0")
    expect(page.locator("#patches")).to_contain_text("attempts 3")
    expect(page.locator("#patches")).to_contain_text("devices download the full artifacts")
    expect(page.locator("#patches-error")).to_have_text(PATCH_ERROR)  # markup stays text
    assert page.locator("#patches b").count() == 0
    SCREENSHOT.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT.with_name("ui-version.png")), full_page=True)


@pytest.mark.parametrize(("env", "outcome"), [
    ({"CI": "true"}, "failed"), ({"MODELFLEET_REQUIRE_POSTGRES": "1"}, "failed"),
    ({}, "skipped")])
def test_missing_chromium_fails_under_ci_and_skips_on_a_dev_box(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], outcome: str) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("MODELFLEET_REQUIRE_POSTGRES", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    expected = pytest.fail.Exception if outcome == "failed" else pytest.skip.Exception
    with pytest.raises(expected):
        chromium_or_skip()
