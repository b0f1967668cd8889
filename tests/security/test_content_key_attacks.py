"""Attacks on `POST /v1/devices/content-key` (protected releases, docs/security.md), over HTTP
with the real app and PostgreSQL: a content key goes only to an enrolled, unrevoked device
the release's rule offers it to (judged on the profile it enrolled), sealed to the X25519 key
it enrolled; it is stored only wrapped and never logged."""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from nacl.exceptions import CryptoError
from nacl.public import PrivateKey, SealedBox
from sqlalchemy import select

from server.db import models as db
from tests.fleet.conftest import Fleet, fleet_settings, open_fleet
from tests.support.fleet_devices import FleetDevice


@dataclass
class BoxDevice(FleetDevice):
    box: PrivateKey = field(default_factory=PrivateKey.generate)

    def enroll_body(self) -> dict[str, Any]:
        return {**super().enroll_body(), "box_public_key": bytes(self.box.public_key).hex()}

    def key_request(self, version: str = "1.0", *, channel: str = "prod",
                    sent_at: int | None = None) -> bytes:
        return json.dumps({"device_id": self.device_id, "channel": channel, "model": "clf",
                           "version": version,
                           "sent_at": int(time.time()) if sent_at is None else sent_at}
                          ).encode()


@pytest.fixture
def fleet(database_url: str, tmp_path: Any) -> Iterator[Fleet]:
    yield from open_fleet(fleet_settings(database_url, tmp_path))


def protect(fleet: Fleet, version: str) -> bytes:
    """Marks the version protected and makes its content key; returns the key."""
    services = fleet.client.app.state.services  # type: ignore[attr-defined]
    with services.session_factory() as s:
        v = s.scalars(select(db.ModelVersion).where(db.ModelVersion.version == version)).one()
        v.protected = True
        key: bytes = services.publisher.content_keys.key_for(s, v.id, create=True)
        s.commit()
    return key


def ask(fleet: Fleet, device: BoxDevice, body: bytes | None = None) -> Any:
    body = body if body is not None else device.key_request()
    return fleet.client.post("/v1/devices/content-key", content=body,
                             headers=device.headers(body))


@pytest.fixture
def key(fleet: Fleet) -> bytes:
    k = protect(fleet, "1.0")
    fleet.rollout("1.0", filters={"platforms": ["android"]})
    return k


def test_offered_device_gets_the_key_sealed_to_its_own_box_key_only(fleet, key, caplog):
    caplog.set_level(logging.DEBUG)
    device = fleet.enroll(BoxDevice("phone-1"))
    r = ask(fleet, device)
    assert r.status_code == 200, r.text
    sealed_key = base64.b64decode(r.json()["sealed_key"])
    assert SealedBox(device.box).decrypt(sealed_key) == key
    with pytest.raises(CryptoError):
        SealedBox(PrivateKey.generate()).decrypt(sealed_key)
    assert key.hex() not in caplog.text and base64.b64encode(key).decode() not in caplog.text
    with fleet.client.app.state.session_factory() as s:  # type: ignore[attr-defined]
        row = s.scalars(select(db.ContentKey)).one()
    assert key not in row.wrapped and len(row.wrapped) == 32 + 40  # secretbox: nonce + MAC


def test_device_the_rule_does_not_offer_gets_no_key(fleet, key):
    ios = fleet.enroll(BoxDevice("iphone-1", platform="ios"))
    r = ask(fleet, ios)
    assert (r.status_code, r.json()["code"]) == (403, "release_not_offered")


def test_halted_release_gives_no_key_to_anyone(fleet, key):
    device = fleet.enroll(BoxDevice("phone-2"))
    rid = fleet.client.get("/v1/channels/prod/rollouts", headers=fleet.ops).json()[0]["id"]
    assert fleet.client.post(f"/v1/rollouts/{rid}/halt", headers=fleet.ops).status_code == 200
    r = ask(fleet, device)
    assert (r.status_code, r.json()["code"]) == (403, "release_not_offered")


def test_revoked_device_gets_no_key(fleet, key):
    device = fleet.enroll(BoxDevice("phone-3"))
    assert fleet.client.post("/v1/devices/phone-3/revoke", headers=fleet.ops).status_code == 200
    r = ask(fleet, device)
    assert (r.status_code, r.json()["code"]) == (401, "device_revoked")


def test_unenrolled_device_gets_no_key(fleet, key):
    r = ask(fleet, BoxDevice("never-enrolled"))
    assert (r.status_code, r.json()["code"]) == (401, "device_unknown")


def test_key_request_signed_with_another_key_is_refused(fleet, key):
    device = fleet.enroll(BoxDevice("phone-4"))
    body = device.key_request()
    r = fleet.client.post("/v1/devices/content-key", content=body,
                          headers=BoxDevice("phone-4").headers(body))
    assert (r.status_code, r.json()["code"]) == (401, "device_signature_invalid")


def test_replayed_old_key_request_is_refused(fleet, key):
    device = fleet.enroll(BoxDevice("phone-5"))
    r = ask(fleet, device, device.key_request(sent_at=int(time.time()) - 3600))
    assert (r.status_code, r.json()["code"]) == (401, "device_report_stale")


def test_key_of_an_unprotected_release_is_not_given(fleet, key):
    fleet.rollout("2.0")
    device = fleet.enroll(BoxDevice("phone-6"))
    r = ask(fleet, device, device.key_request("2.0"))
    assert (r.status_code, r.json()["code"]) == (404, "release_not_found")


def test_old_agent_without_box_key_still_enrols_then_adds_it(fleet, key):
    old = BoxDevice("legacy-1")
    r = fleet.client.post("/v1/devices/enroll", json=FleetDevice.enroll_body(old),
                          headers={"Authorization": f"Bearer {fleet.enroll_token}"})
    assert r.status_code == 201, r.text
    r = ask(fleet, old)
    assert (r.status_code, r.json()["code"]) == (409, "device_box_key_missing")
    again = fleet.client.post("/v1/devices/enroll", json=old.enroll_body(),
                              headers={"Authorization": f"Bearer {fleet.enroll_token}"})
    assert again.status_code == 200, again.text
    assert ask(fleet, old).status_code == 200


def test_enrolled_box_key_cannot_be_swapped_for_an_attackers(fleet, key):
    device = fleet.enroll(BoxDevice("phone-7"))
    thief = BoxDevice("phone-7", key=device.key)  # even with the device's signing key
    r = fleet.client.post("/v1/devices/enroll", json=thief.enroll_body(),
                          headers={"Authorization": f"Bearer {fleet.enroll_token}"})
    assert (r.status_code, r.json()["code"]) == (409, "device_key_mismatch")
    sealed_key = base64.b64decode(ask(fleet, device).json()["sealed_key"])
    with pytest.raises(CryptoError):
        SealedBox(thief.box).decrypt(sealed_key)
