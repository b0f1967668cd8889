"""Attacks on device telemetry, over HTTP with the real app: every refused batch stores
nothing (no telemetry row, no device standing, the device's last_seen unchanged)."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import pytest
from nacl.signing import SigningKey
from sqlalchemy import func, select

from server.db import models as db
from tests.fleet.conftest import Fleet, fleet_settings, open_fleet
from tests.support.fleet_devices import FleetDevice, shadow_report


@pytest.fixture
def fleet(database_url: str, tmp_path: Any) -> Iterator[Fleet]:
    yield from open_fleet(fleet_settings(database_url, tmp_path, telemetry_rate_per_second=2,
                                         telemetry_burst=5))


@pytest.fixture
def device(fleet: Fleet) -> FleetDevice:
    fleet.rollout("1.0", mode="shadow", shadow={"max_kl_micro": 1, "max_latency_p99_us": 1,
                                                "min_samples": 1},
                  guard={"min_devices": 1})
    return fleet.enroll(FleetDevice("victim-01"))


def stored(fleet: Fleet) -> tuple[int, int]:
    with fleet.client.app.state.session_factory() as s:  # type: ignore[attr-defined]
        events = s.scalar(select(func.count()).select_from(db.TelemetryEvent))
        standings = s.scalar(select(func.count()).select_from(db.DeviceRelease))
    return int(events or 0), int(standings or 0)


def failing_batch(device: FleetDevice) -> bytes:
    # A failed verdict: if it were stored, the guard would halt the rollout.
    return device.batch([shadow_report("clf", "1.0", "failed")])


def assert_refused(fleet: Fleet, r: Any, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    assert r.json()["code"] == code
    assert stored(fleet) == (0, 0)
    rollouts = fleet.client.get("/v1/channels/prod/rollouts", headers=fleet.ops).json()
    assert rollouts[0]["state"] == "active"


def test_unsigned_report_is_refused(fleet: Fleet, device: FleetDevice) -> None:
    body = failing_batch(device)
    r = fleet.client.post("/v1/telemetry", content=body,
                          headers={"Content-Type": "application/json",
                                   "X-Device-Id": device.device_id})
    assert_refused(fleet, r, 401, "device_signature_invalid")


def test_report_signed_with_another_key_is_refused(fleet: Fleet, device: FleetDevice) -> None:
    body = failing_batch(device)
    r = fleet.client.post("/v1/telemetry", content=body,
                          headers=device.headers(body, key=SigningKey.generate()))
    assert_refused(fleet, r, 401, "device_signature_invalid")


def test_report_body_altered_after_signing_is_refused(fleet: Fleet,
                                                      device: FleetDevice) -> None:
    body = device.batch([shadow_report("clf", "1.0", "passed")])
    headers = device.headers(body)
    tampered = body.replace(b'"passed"', b'"failed"')
    r = fleet.client.post("/v1/telemetry", content=tampered, headers=headers)
    assert_refused(fleet, r, 401, "device_signature_invalid")


def test_report_from_unenrolled_device_is_refused(fleet: Fleet, device: FleetDevice) -> None:
    stranger = FleetDevice("never-enrolled")
    body = failing_batch(stranger)
    r = fleet.client.post("/v1/telemetry", content=body, headers=stranger.headers(body))
    assert_refused(fleet, r, 401, "device_unknown")


def test_device_signing_a_batch_in_another_devices_name_is_refused(
        fleet: Fleet, device: FleetDevice) -> None:
    attacker = fleet.enroll(FleetDevice("attacker-01"))
    body = failing_batch(device)  # device_id "victim-01" in the body
    # The victim's id in the header, signed with the attacker's own (enrolled) key.
    r = fleet.client.post("/v1/telemetry", content=body,
                          headers=device.headers(body, key=attacker.key))
    assert_refused(fleet, r, 401, "device_signature_invalid")
    # The attacker's id and valid signature, the victim's id in the body.
    r = fleet.client.post("/v1/telemetry", content=body, headers=attacker.headers(body))
    assert r.status_code == 422 and r.json()["field"] == "device_id"
    assert stored(fleet) == (0, 0)


def test_revoked_device_reports_are_refused(fleet: Fleet, device: FleetDevice) -> None:
    r = fleet.client.post(f"/v1/devices/{device.device_id}/revoke", headers=fleet.ops)
    assert r.status_code == 200, r.text
    body = failing_batch(device)
    r = fleet.client.post("/v1/telemetry", content=body, headers=device.headers(body))
    assert_refused(fleet, r, 401, "device_revoked")
    again = fleet.client.post("/v1/devices/enroll", json=device.enroll_body(),
                              headers={"Authorization": f"Bearer {fleet.enroll_token}"})
    assert again.status_code == 409 and again.json()["code"] == "device_revoked"


def test_revoke_needs_the_rollout_scope(fleet: Fleet, device: FleetDevice) -> None:
    r = fleet.client.post(f"/v1/devices/{device.device_id}/revoke",
                          headers={"Authorization": f"Bearer {fleet.enroll_token}"})
    assert r.status_code == 403


def test_replayed_stale_batch_is_refused(fleet: Fleet, device: FleetDevice) -> None:
    old = device.batch([shadow_report("clf", "1.0", "failed")], sent_at=int(time.time()) - 601)
    r = fleet.client.post("/v1/telemetry", content=old, headers=device.headers(old))
    assert_refused(fleet, r, 401, "device_report_stale")
    future = device.batch([shadow_report("clf", "1.0", "failed")],
                          sent_at=int(time.time()) + 3600)
    r = fleet.client.post("/v1/telemetry", content=future, headers=device.headers(future))
    assert_refused(fleet, r, 401, "device_report_stale")


def test_replayed_fresh_batch_stores_its_reports_once(fleet: Fleet, device: FleetDevice) -> None:
    body = device.batch([shadow_report("clf", "1.0", "pending")])
    first = fleet.client.post("/v1/telemetry", content=body, headers=device.headers(body))
    replay = fleet.client.post("/v1/telemetry", content=body, headers=device.headers(body))
    assert first.json() == {"accepted": 1, "duplicates": 0}
    assert replay.json() == {"accepted": 0, "duplicates": 1}
    assert stored(fleet) == (1, 1)


def test_oversize_batch_is_refused_before_it_is_read(fleet: Fleet, device: FleetDevice) -> None:
    body = device.batch([shadow_report("clf", "1.0", "failed", reason="x" * 500)
                         for _ in range(500)])
    assert len(body) > 256 * 1024
    r = fleet.client.post("/v1/telemetry", content=body, headers=device.headers(body))
    assert r.status_code == 413
    assert r.headers["connection"] == "close"
    assert stored(fleet) == (0, 0)


def test_oversize_batch_streamed_without_length_is_cut_at_the_cap(
        fleet: Fleet, device: FleetDevice) -> None:
    sent = 0

    def chunks() -> Iterator[bytes]:
        nonlocal sent
        for _ in range(64):  # 4 MiB offered, 64 KiB at a time
            sent += 65536
            yield b" " * 65536

    r = fleet.client.post("/v1/telemetry", content=chunks(),
                          headers={"X-Device-Id": device.device_id,
                                   "X-Device-Signature": base64.b64encode(b"0" * 64).decode()})
    # A body without a length is refused before any of it is read (411: writes must say their
    # length, so no trailer can reach authentication either — tests/security/
    # test_http_attacks.py); before that rule it was cut at the cap with 413.
    assert r.status_code == 411
    assert sent < 4 * 65536  # the 4 MiB offered was not taken in
    assert stored(fleet) == (0, 0)


def test_report_flood_from_one_device_is_rate_limited(fleet: Fleet,
                                                      device: FleetDevice) -> None:
    statuses = []
    for _ in range(12):  # burst 5, 2/s
        body = device.batch([shadow_report("clf", "1.0", "pending")])
        r = fleet.client.post("/v1/telemetry", content=body, headers=device.headers(body))
        statuses.append(r.status_code)
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1
            assert r.json()["code"] == "rate_limited"
    assert statuses[:5] == [200] * 5 and statuses.count(429) >= 5
    assert stored(fleet)[0] == statuses.count(200)
    # Another device is not held back by the flood.
    other = fleet.enroll(FleetDevice("bystander-01"))
    body = other.batch([shadow_report("clf", "1.0", "pending")])
    assert fleet.client.post("/v1/telemetry", content=body,
                             headers=other.headers(body)).status_code == 200


@pytest.mark.parametrize("mutate, field", [
    (lambda r: r | {"kind": "keylogger"}, "reports[0].kind"),
    (lambda r: r | {"samples": -1}, "reports[0].samples"),
    (lambda r: r | {"samples": True}, "reports[0].samples"),
    (lambda r: r | {"input_pixels": [1, 2, 3]}, "reports[0].input_pixels"),
    (lambda r: r | {"id": "not-hex"}, "reports[0].id"),
    (lambda r: r | {"reason": "x" * 501}, "reports[0].reason"),
])
def test_malformed_report_refuses_the_whole_batch(fleet: Fleet, device: FleetDevice,
                                                  mutate: Any, field: str) -> None:
    good = shadow_report("clf", "1.0", "pending")
    body = device.batch([good, mutate(shadow_report("clf", "1.0", "failed"))])
    r = fleet.client.post("/v1/telemetry", content=body, headers=device.headers(body))
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field.replace("[0]", "[1]")
    assert stored(fleet) == (0, 0)


def test_non_strict_json_is_refused(fleet: Fleet, device: FleetDevice) -> None:
    report = shadow_report("clf", "1.0", "failed")
    text = device.batch([report]).decode()
    for bad in (text.replace('"dropped":3', '"dropped":3.0'),
                text.replace('"dropped":3', '"dropped":3,"dropped":4'),
                text.replace('"dropped":3', '"dropped":NaN')):
        body = bad.encode()
        r = fleet.client.post("/v1/telemetry", content=body, headers=device.headers(body))
        assert r.status_code == 422, (bad, r.text)
    assert stored(fleet) == (0, 0)
