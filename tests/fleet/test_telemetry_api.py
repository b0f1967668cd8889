"""Enrolment and telemetry over HTTP with real signed batches: idempotent enrolment, reports
stored once, the devices table kept current (what previews and health count)."""

from __future__ import annotations

import json

from sqlalchemy import select
from typer.testing import CliRunner

from server.db import models as db
from server.observability.metrics import TELEMETRY_REPORTS
from tests.fleet.conftest import Fleet
from tests.support.fleet_devices import FleetDevice, shadow_report, update_report


def test_tokens_create_scope_enroll_prints_the_token_last_and_it_enrols(fleet: Fleet,
                                                                          tmp_path) -> None:
    from modelfleet.cli import app as cli

    data = tmp_path / "cli-data"
    result = CliRunner().invoke(cli, ["tokens", "create", "--data-dir", str(data),
                                      "--scope", "enroll"])
    assert result.exit_code == 0, result.output
    token = result.output.strip().splitlines()[-1]
    assert token.startswith("mf_")
    listed = CliRunner().invoke(cli, ["tokens", "list", "--data-dir", str(data), "--json"])
    assert json.loads(listed.output)[0]["scopes"] == ["enroll"]


def test_enrol_is_idempotent_and_a_second_key_for_the_id_is_refused(fleet: Fleet) -> None:
    device = FleetDevice("pixel-0001")
    auth = {"Authorization": f"Bearer {fleet.enroll_token}"}
    first = fleet.client.post("/v1/devices/enroll", json=device.enroll_body(), headers=auth)
    assert first.status_code == 201, first.text
    assert first.json()["keyid"] == __import__("hashlib").sha256(
        bytes(device.key.verify_key)).hexdigest()
    again = fleet.client.post("/v1/devices/enroll", json=device.enroll_body(), headers=auth)
    assert again.status_code == 200
    assert again.json() == first.json()
    other = FleetDevice("pixel-0001")  # a new key for the same id
    clash = fleet.client.post("/v1/devices/enroll", json=other.enroll_body(), headers=auth)
    assert clash.status_code == 409
    assert clash.json()["code"] == "device_key_mismatch"


def test_enrol_needs_the_enroll_scope_and_a_valid_device_id(fleet: Fleet) -> None:
    device = FleetDevice("pixel-0002")
    r = fleet.client.post("/v1/devices/enroll", json=device.enroll_body(), headers=fleet.ops)
    assert r.status_code == 403
    body = device.enroll_body() | {"device_id": "bad/id"}
    r = fleet.client.post("/v1/devices/enroll", json=body,
                          headers={"Authorization": f"Bearer {fleet.enroll_token}"})
    assert r.status_code == 422 and r.json()["field"] == "device_id"


def test_reports_are_stored_once_and_the_device_row_follows_them(fleet: Fleet) -> None:
    fleet.rollout("1.0")
    device = fleet.enroll(FleetDevice("pixel-0003", platform="ios", os_version="17.2"))
    reports = [update_report("clf", "1.0", "downloaded"),
               update_report("clf", "1.0", "activated"),
               {"id": "ab" * 16, "kind": "health", "at": 1, "model": "clf", "version": "1.0",
                "artifact_sha256": None, "channel": "prod", "predictions": 10, "errors": 0,
                "p99_us": 1200, "rolled_back": False}]
    counted = {k: TELEMETRY_REPORTS.labels(k)._value.get() for k in ("accepted", "duplicate")}
    r = fleet.send(device, reports)
    assert r.status_code == 200, r.text
    assert r.json() == {"accepted": 3, "duplicates": 0}
    again = fleet.send(device, [*reports, update_report("clf", "1.0", "verified")])
    assert again.json() == {"accepted": 1, "duplicates": 3}
    # GET /metrics: modelfleet_telemetry_reports_total counts what the answers said.
    assert {k: TELEMETRY_REPORTS.labels(k)._value.get() - n for k, n in counted.items()} == {
        "accepted": 4, "duplicate": 3}
    assert fleet.events() == 4
    listed = fleet.client.get("/v1/devices", headers=fleet.ops).json()["devices"]
    assert [d["id"] for d in listed] == ["pixel-0003"]
    assert listed[0]["profile"]["platform"] == "ios"
    with fleet.client.app.state.session_factory() as s:  # type: ignore[attr-defined]
        row = s.get(db.Device, "pixel-0003")
        assert row is not None and row.active_versions == {"clf": "1.0"}
        kinds = sorted(s.scalars(select(db.TelemetryEvent.kind)))
    assert kinds == ["health", "update.activated", "update.downloaded", "update.verified"]


def test_update_events_of_one_second_count_the_last_one_sent(fleet: Fleet) -> None:
    rollout = fleet.rollout("1.0")
    device = fleet.enroll(FleetDevice("pixel-0004"))
    fleet.send(device, [update_report("clf", "1.0", e, at=500)
                        for e in ("downloaded", "verified", "activated")])
    health = fleet.client.get(f"/v1/rollouts/{rollout['id']}", headers=fleet.ops).json()
    assert health["health"]["devices"]["active"] == 1


def test_preview_over_seen_devices_counts_the_enrolled_fleet(fleet: Fleet, devices) -> None:
    devices(6)  # three android, three ios
    fleet.client.post("/v1/channels", json={"name": "prod"}, headers=fleet.ops)
    r = fleet.client.post("/v1/channels/prod/preview", headers=fleet.ops,
                          json={"model": "clf", "version": "1.0", "percentage": 100,
                                "filters": {"platforms": ["ios"]}})
    assert r.status_code == 200, r.text
    assert (r.json()["total"], r.json()["included"]) == (6, 3)


def test_health_counts_each_device_once_from_its_latest_reports(fleet: Fleet, devices) -> None:
    rollout = fleet.rollout("2.0", mode="shadow", guard={"min_devices": 50},
                            shadow={"max_kl_micro": 5_000, "max_latency_p99_us": 10_000,
                                    "min_samples": 100})
    fleet_devices = devices(4)
    for i, d in enumerate(fleet_devices):
        reports = [update_report("clf", "2.0", "downloaded", at=100),
                   shadow_report("clf", "2.0", "pending", kl=100 * (i + 1), at=101)]
        if i < 3:  # three decide later: two pass, one fails; the first pending is superseded
            # (the failure is one figures cannot show, so it says why: the candidate crashed)
            reports.append(shadow_report("clf", "2.0", "failed" if i == 2 else "passed",
                                         kl=1_000 * (i + 1), at=200,
                                         reason="candidate raised RuntimeError" if i == 2
                                         else None))
        assert fleet.send(d, reports).status_code == 200
    # An older report arriving late does not replace the newer verdict.
    assert fleet.send(fleet_devices[0], [shadow_report("clf", "2.0", "pending", at=150)]
                      ).status_code == 200
    body = fleet.client.get(f"/v1/rollouts/{rollout['id']}", headers=fleet.ops).json()
    assert body["mode"] == "shadow" and body["state"] == "active"
    health = body["health"]
    assert health["devices"] == {"offered": 4, "downloaded": 4, "shadow": 1, "passed": 2,
                                 "failed": 1, "active": 0, "rolled_back": 0,
                                 "not_offered": 0, "forged": 0, "unattested": 0, "revoked": 0}
    # Latest mean KL per device: 1000, 2000, 3000 and 400 (still pending); nearest rank.
    assert health["kl_micro"] == {"p50": 1_000, "p99": 3_000, "max": 12_000}
    assert health["latency_p99_us"] == {"active_p50": 900, "candidate_p50": 1_000,
                                        "candidate_p99": 2_000}
    assert health["guard"] == {"min_devices": 50, "max_fail_share": 0.2,
                               "max_latency_p99_us": None, "promote_min_passed": None,
                               "promote_min_spread_seconds": 0}
