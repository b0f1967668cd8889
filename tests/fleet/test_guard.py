"""The guard over HTTP with real signed reports: an automatic halt (new signed manifest with a
higher serial, audit event by `system` with the reason, webhook POST), automatic and manual
promotion of a shadow rollout, the latency budget, rollbacks of an active rollout."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

import manifests
from server.rollouts.rules import release_salt
from tests.fleet.conftest import Fleet, fleet_settings, open_fleet
from tests.support.fleet_devices import FleetDevice, shadow_report, update_report

SHADOW = {"max_kl_micro": 5_000, "max_latency_p99_us": 10_000, "min_samples": 100}


class Webhook:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        received = self.calls

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                received.append(json.loads(self.rfile.read(length)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/halt"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, n: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while len(self.calls) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.calls


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    yield hook
    hook.server.shutdown()
    hook.server.server_close()


@pytest.fixture
def hooked(database_url: str, tmp_path: Any, webhook: Webhook) -> Iterator[Fleet]:
    yield from open_fleet(fleet_settings(database_url, tmp_path, halt_webhook_url=webhook.url))


def serial(fleet: Fleet) -> int:
    channels = fleet.client.get("/v1/channels", headers=fleet.ops).json()
    return int(next(c["serial"] for c in channels if c["name"] == "prod"))


def rollout_state(fleet: Fleet, rollout_id: int) -> dict[str, Any]:
    out: dict[str, Any] = fleet.client.get(f"/v1/rollouts/{rollout_id}", headers=fleet.ops).json()
    return out


def enrolled(fleet: Fleet, n: int, *, share_ppm: int | None = None,
             version: str = "2.0") -> list[FleetDevice]:
    """`n` enrolled devices; with `share_ppm`, ones whose bucket for `version` on prod is
    inside that share (the only devices whose reports count at that share)."""
    ids = [f"dev-{i:03d}" for i in range(n)] if share_ppm is None else offered_ids(
        n, share_ppm, version)
    return [fleet.enroll(FleetDevice(d, platform=("android", "ios")[i % 2]))
            for i, d in enumerate(ids)]


def offered_ids(n: int, share_ppm: int, version: str = "2.0", prefix: str = "dev") -> list[str]:
    salt = release_salt("prod", "clf", version)
    ids = (f"{prefix}-{i:05d}" for i in range(10_000_000))
    return list(itertools.islice((d for d in ids if manifests.bucket(salt, d) < share_ppm), n))


def audit(fleet: Fleet, action: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = fleet.client.get(
        "/v1/audit", params={"action": action}, headers=fleet.ops).json()["events"]
    return events


def served_release(fleet: Fleet, version: str) -> manifests.Release | None:
    root = manifests.load_trusted_root(fleet.client.get("/v1/root/1.json").content)
    m = manifests.verify_manifest(root, fleet.client.get("/v1/channels/prod/manifest").content,
                                  now=int(time.time()), channel="prod", trusted=None)
    entry = m.models.get("clf")
    return next((r for r in entry.releases if r.version == version), None) if entry else None


def test_failed_share_at_min_devices_halts_at_once_signed_audited_and_webhooked(
        hooked: Fleet, webhook: Webhook) -> None:
    fleet = hooked
    rollout = fleet.rollout("2.0", mode="shadow", shadow=SHADOW,
                            guard={"min_devices": 5, "max_fail_share": 0.2})
    devices = enrolled(fleet, 6)
    for d in devices[:4]:  # four pass: below min_devices, nothing happens
        assert fleet.send(d, [shadow_report("clf", "2.0", "passed")]).status_code == 200
    assert rollout_state(fleet, rollout["id"])["state"] == "active"
    before = serial(fleet)
    # The fifth reports a failed verdict: 1 of 5 = 20% >= 20% -> halted in this request.
    r = fleet.send(devices[4], [shadow_report("clf", "2.0", "failed", kl=90_000)])
    assert r.status_code == 200
    state = rollout_state(fleet, rollout["id"])
    assert state["state"] == "halted"
    assert "1 of 5 reporting devices failed" in state["state_reason"]
    assert serial(fleet) == before + 1
    assert served_release(fleet, "2.0") is None  # halted: no longer offered
    halts = audit(fleet, "rollout.halt")
    assert [(e["actor"], e["details"]["reason"]) for e in halts] == [
        ("system", state["state_reason"])]
    calls = webhook.wait(1)
    assert calls == [{"event": "rollout.halted", "rollout_id": rollout["id"],
                      "channel": "prod", "model": "clf", "version": "2.0",
                      "reason": state["state_reason"], "serial": before + 1,
                      "actor": "system"}]
    # More failures after the halt change nothing: no new manifest, no second webhook.
    fleet.send(devices[5], [shadow_report("clf", "2.0", "failed")])
    assert serial(fleet) == before + 1 and len(webhook.wait(2, timeout_s=0.5)) == 1


def test_a_device_counts_once_however_often_it_reports_failed(fleet: Fleet) -> None:
    rollout = fleet.rollout("2.0", mode="shadow", shadow=SHADOW,
                            guard={"min_devices": 3, "max_fail_share": 0.5})
    bad, *good = enrolled(fleet, 3)
    for _ in range(5):
        fleet.send(bad, [shadow_report("clf", "2.0", "failed", kl=90_000)])
    for d in good:
        fleet.send(d, [shadow_report("clf", "2.0", "passed")])
    state = rollout_state(fleet, rollout["id"])
    assert state["state"] == "active"  # 1 of 3, not 5 of 7
    assert state["health"]["devices"]["failed"] == 1


def test_fleet_pass_with_auto_promote_turns_the_release_active(fleet: Fleet) -> None:
    rollout = fleet.rollout("2.0", mode="shadow", shadow=SHADOW, auto_promote=True,
                            guard={"min_devices": 4, "max_fail_share": 0.3,
                                   "promote_min_passed": 3})
    assert served_release(fleet, "2.0").rollout.mode == "shadow"  # type: ignore[union-attr]
    devices = enrolled(fleet, 4)
    # A failure its figures explain (mean KL over the limit): tolerated under 30%.
    fleet.send(devices[0], [shadow_report("clf", "2.0", "failed", kl=90_000)])
    for d in devices[1:3]:
        fleet.send(d, [shadow_report("clf", "2.0", "passed")])
    assert rollout_state(fleet, rollout["id"])["mode"] == "shadow"  # 3 reporting < 4
    before = serial(fleet)
    fleet.send(devices[3], [shadow_report("clf", "2.0", "passed")])  # 1 of 4 = 25% < 30%
    state = rollout_state(fleet, rollout["id"])
    assert (state["mode"], state["state"]) == ("active", "active")
    assert serial(fleet) == before + 1
    assert served_release(fleet, "2.0").rollout.mode == "active"  # type: ignore[union-attr]
    assert [e["actor"] for e in audit(fleet, "rollout.promote")] == ["system"]


def test_without_auto_promote_a_passing_shadow_waits_for_patch_mode_active(fleet: Fleet) -> None:
    rollout = fleet.rollout("2.0", mode="shadow", shadow=SHADOW, guard={"min_devices": 2})
    for d in enrolled(fleet, 3):
        fleet.send(d, [shadow_report("clf", "2.0", "passed")])
    assert rollout_state(fleet, rollout["id"])["mode"] == "shadow"
    r = fleet.client.patch(f"/v1/rollouts/{rollout['id']}", json={"mode": "active"},
                           headers=fleet.ops)
    assert r.status_code == 200, r.text
    assert r.json()["mode"] == "active" and r.json()["serial"] == serial(fleet)
    assert served_release(fleet, "2.0").rollout.mode == "active"  # type: ignore[union-attr]
    assert fleet.client.patch(f"/v1/rollouts/{rollout['id']}", json={},
                              headers=fleet.ops).status_code == 422
    fleet.client.post(f"/v1/rollouts/{rollout['id']}/halt", headers=fleet.ops)
    r = fleet.client.patch(f"/v1/rollouts/{rollout['id']}", json={"mode": "active"},
                           headers=fleet.ops)
    assert r.status_code == 409


def test_candidate_p99_over_the_latency_budget_counts_as_failed(fleet: Fleet) -> None:
    rollout = fleet.rollout("2.0", mode="shadow", shadow=SHADOW,
                            guard={"min_devices": 2, "max_fail_share": 0.5,
                                   "max_latency_p99_us": 1_500})
    slow, fast = enrolled(fleet, 2)
    fleet.send(fast, [shadow_report("clf", "2.0", "passed", candidate_p99=1_200)])
    assert rollout_state(fleet, rollout["id"])["state"] == "active"
    fleet.send(slow, [shadow_report("clf", "2.0", "passed", candidate_p99=4_000)])
    assert rollout_state(fleet, rollout["id"])["state"] == "halted"


def test_rollbacks_on_an_active_rollout_halt_it(fleet: Fleet) -> None:
    rollout = fleet.rollout("2.0", guard={"min_devices": 3, "max_fail_share": 0.5})
    devices = enrolled(fleet, 3)
    fleet.send(devices[0], [update_report("clf", "2.0", "activated")])
    fleet.send(devices[1], [update_report("clf", "2.0", "activated", at=100),
                            update_report("clf", "2.0", "rolled_back", at=101)])
    assert rollout_state(fleet, rollout["id"])["state"] == "active"  # 2 reporting < 3
    fleet.send(devices[2], [update_report("clf", "2.0", "failed")])
    state = rollout_state(fleet, rollout["id"])
    assert state["state"] == "halted"
    assert state["health"]["devices"]["rolled_back"] == 1
