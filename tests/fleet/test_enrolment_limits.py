"""Enrolment that cannot be farmed (issue 20) over HTTP, on SQLite and PostgreSQL: the
`enroll` token every app carries reads nothing, enrols within its device quota and hourly
rate until it expires, and cannot claim an id a rollout pins (an operator registers it)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi.routing import APIRoute

from server.api import ROUTERS
from server.api.deps import any_token
from server.auth import create_token
from server.db import models as db
from server.db.types import utcnow
from tests.fleet.conftest import Fleet
from tests.support.fleet_devices import FleetDevice


def token(fleet: Fleet, **limits: Any) -> str:
    with fleet.client.app.state.session_factory() as s:  # type: ignore[attr-defined]
        _, secret = create_token(s, ["enroll"], name="app", **limits)
        s.commit()
    return secret


def enrol(fleet: Fleet, secret: str, device: FleetDevice) -> Any:
    return fleet.client.post("/v1/devices/enroll", json=device.enroll_body(),
                             headers={"Authorization": f"Bearer {secret}"})


def _reads_with_a_token() -> list[str]:
    """Every GET route that needs a token, its path parameters filled in."""
    paths = []
    for route in (r for router in ROUTERS for r in router.routes):
        if not isinstance(route, APIRoute) or "GET" not in (route.methods or set()):
            continue
        stack, needs = [route.dependant], False
        while stack:
            d = stack.pop()
            needs = needs or d.call is any_token
            stack.extend(d.dependencies)
        if needs:
            path = route.path_format
            for name in route.param_convertors:
                path = path.replace("{" + name + "}", "1" if name.endswith("_id") else "prod")
            paths.append(path)
    return paths


def test_the_app_enroll_token_reads_no_route(fleet: Fleet) -> None:
    fleet.rollout("2.0")
    paths = _reads_with_a_token()
    assert {"/v1/audit", "/v1/devices", "/v1/channels", "/v1/rollouts/1",
            "/v1/rollouts/1/timeline"} <= set(paths), paths
    app_token = {"Authorization": f"Bearer {fleet.enroll_token}"}
    for path in paths:
        r = fleet.client.get(path, headers=app_token)
        assert r.status_code == 403, (path, r.status_code, r.text)
        assert "enrols devices and nothing else" in r.json()["detail"]
        assert fleet.client.get(path, headers=fleet.ops).status_code == 200, path


def test_enrolment_farming_stops_at_the_token_quota(fleet: Fleet) -> None:
    secret = token(fleet, device_quota=2)
    first, second, third = (FleetDevice(f"farm-{i}") for i in range(3))
    assert enrol(fleet, secret, first).status_code == 201
    assert enrol(fleet, secret, second).status_code == 201
    r = enrol(fleet, secret, third)
    assert r.status_code == 403 and r.json()["code"] == "enrolment_quota_exhausted", r.text
    assert enrol(fleet, secret, first).status_code == 200  # a retry is no new device
    with fleet.client.app.state.session_factory() as s:  # type: ignore[attr-defined]
        assert s.get(db.Device, "farm-2") is None
        assert s.get(db.Device, "farm-0").enrolled_by_token_id is not None  # type: ignore[union-attr]
    # Another token's quota is its own.
    assert enrol(fleet, token(fleet, device_quota=1), third).status_code == 201


def test_enrolment_burst_is_rate_limited_per_token(fleet: Fleet) -> None:
    secret = token(fleet, enroll_per_hour=2)
    for i in range(2):
        assert enrol(fleet, secret, FleetDevice(f"burst-{i}")).status_code == 201
    r = enrol(fleet, secret, FleetDevice("burst-2"))
    assert r.status_code == 429 and r.json()["code"] == "rate_limited", r.text
    assert 3000 < int(r.headers["Retry-After"]) <= 3601


def test_an_expired_enrolment_token_is_refused(fleet: Fleet) -> None:
    secret = token(fleet, expires_at=utcnow() + timedelta(hours=1))
    assert enrol(fleet, secret, FleetDevice("early")).status_code == 201
    with fleet.client.app.state.session_factory() as s:  # type: ignore[attr-defined]
        row = s.query(db.ApiToken).filter_by(name="app").one()
        row.expires_at = utcnow() - timedelta(seconds=1)
        s.commit()
    r = enrol(fleet, secret, FleetDevice("late"))
    assert r.status_code == 401 and "expired" in r.json()["detail"], r.text


def test_a_pinned_device_id_cannot_be_claimed_with_the_app_token(fleet: Fleet) -> None:
    real = FleetDevice("pinned-qa-7")
    fleet.rollout("2.0", percentage=0, filters={"device_allow": [real.device_id]})
    squatter = FleetDevice(real.device_id)  # same id, the attacker's own key
    r = enrol(fleet, fleet.enroll_token, squatter)
    assert r.status_code == 403 and r.json()["code"] == "device_id_pinned", r.text
    # The operator registers the real device's key; its own enrolment is then a no-op.
    r = fleet.client.post("/v1/devices/register", json=real.enroll_body(), headers=fleet.ops)
    assert r.status_code == 201, r.text
    assert enrol(fleet, fleet.enroll_token, real).status_code == 200
    r = enrol(fleet, fleet.enroll_token, squatter)
    assert r.status_code == 409 and r.json()["code"] == "device_key_mismatch"
    [event] = fleet.client.get("/v1/audit", params={"action": "device.enroll"},
                               headers=fleet.ops).json()["events"]
    assert event["details"]["by_operator"] is True
    # The app's token cannot register.
    r = fleet.client.post("/v1/devices/register", json=FleetDevice("x").enroll_body(),
                          headers={"Authorization": f"Bearer {fleet.enroll_token}"})
    assert r.status_code == 403
