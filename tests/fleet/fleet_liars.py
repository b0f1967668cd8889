"""Liars for the fleet simulation (tests/fleet/test_fleet_simulation.py, issue 20): devices
enrolled with the app's own enrolment token that try to move the guard, in four groups —

- `not_offered`: enrolled as a platform the releases have no artifact for, so the rule
  offers them nothing; they report failures of the good release and passes of the bad one;
- `replaying`: they resend honest devices' stored reports (same report ids) in their own
  signed batches, and under the honest device's id with their own signature;
- `contradicting`: offered (ids inside the good release's bucket); they report verdicts their
  own figures contradict — failed with clean figures, passed with a KL far over the limit;
- `revoked`: offered, and lying consistently (failed, with figures that fail) before the
  honest devices report; an operator revokes them mid-way, and then they push the bad one.

`Hooks` is the honest fleet (no liars); `Liars` plays the groups between honest cycles and
counts what the server answered; the tests read what was stored."""

from __future__ import annotations

import itertools
from typing import Any

import requests
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

import manifests
from server.db import models as db
from server.rollouts.rules import release_salt
from tests.support.fleet_devices import FleetDevice, report_id, shadow_report

GROUPS = ("not_offered", "replaying", "contradicting", "revoked")
BAD_KL = 90_000  # far over the simulation's max_kl_micro
REVOKE_AFTER = 3  # honest devices cycled on the good release when the operator revokes
REPLAY_FIRST = 15  # honest devices whose reports the replayers resend, per release


class Hooks:
    """The honest fleet: nothing happens between cycles."""

    def enrolled(self, server: Any, enroll_token: str) -> None:
        pass

    def describe(self) -> str:
        return ""

    def good_started(self, rollout_id: int) -> None:
        pass

    def honest_cycled(self, phase: str, device_id: str, index: int) -> None:
        pass

    def bad_started(self, rollout_id: int) -> None:
        pass

    def finished(self, good_id: int, bad_id: int) -> None:
        pass


def _in_bucket(version: str, share_ppm: int, prefix: str) -> Any:
    salt = release_salt("prod", "clf", version)
    return (d for d in (f"{prefix}-{i:04d}" for i in itertools.count())
            if manifests.bucket(salt, d) < share_ppm)


class Liars(Hooks):
    """`share` of all enrolled devices are liars (with `honest` honest ones)."""

    def __init__(self, url: str, factory: sessionmaker[Session], ops_token: str, *,
                 honest: int, share: float) -> None:
        self.url, self.factory = url, factory
        self.http = requests.Session()
        self.ops = {"Authorization": f"Bearer {ops_token}"}
        total = round(share * honest / (1 - share))
        sizes = [total // len(GROUPS)] * len(GROUPS)
        sizes[0] += total - sum(sizes)
        inside = _in_bucket("2.0.0", 500_000, "liar")
        self.groups: dict[str, list[FleetDevice]] = {
            "not_offered": [FleetDevice(f"liar-n{i:02d}", platform="android")
                            for i in range(sizes[0])],
            "replaying": [FleetDevice(f"liar-p{i:02d}", platform="onnx")
                          for i in range(sizes[1])],
            "contradicting": [FleetDevice(next(inside), platform="onnx")
                              for _ in range(sizes[2])],
            "revoked": [FleetDevice(next(inside), platform="onnx") for _ in range(sizes[3])],
        }
        self.replays = {"sent": 0, "refused": 0, "accepted": 0, "duplicates": 0}
        self.revoked_refusals = 0
        self._phase_rollout: dict[str, int] = {}

    def all(self) -> list[FleetDevice]:
        return [d for group in self.groups.values() for d in group]

    def describe(self) -> str:
        sizes = ", ".join(f"{len(g)} {name}" for name, g in self.groups.items())
        return f", plus {len(self.all())} liars ({sizes})"

    # ------------------------------------------------------------------ talking

    def send(self, device: FleetDevice, reports: list[dict[str, Any]],
             device_id: str | None = None) -> requests.Response:
        body = device.batch(reports)
        headers = device.headers(body)
        if device_id is not None:
            headers["X-Device-Id"] = device_id
        return self.http.post(f"{self.url}/v1/telemetry", data=body, headers=headers,
                              timeout=30)

    def _all_ok(self, group: str, reports: list[dict[str, Any]]) -> None:
        for d in self.groups[group]:
            r = self.send(d, [dict(r, id=report_id()) for r in reports])  # its own ids
            assert r.status_code == 200, (d.device_id, r.status_code, r.text)

    def health(self, rollout_id: int) -> dict[str, int]:
        r = self.http.get(f"{self.url}/v1/rollouts/{rollout_id}", headers=self.ops, timeout=30)
        assert r.status_code == 200, r.text
        out: dict[str, int] = r.json()["health"]["devices"]
        return out

    # ------------------------------------------------------------------ the hooks

    def enrolled(self, server: Any, enroll_token: str) -> None:
        for d in self.all():
            r = self.http.post(f"{self.url}/v1/devices/enroll", json=d.enroll_body(),
                               headers={"Authorization": f"Bearer {enroll_token}"}, timeout=30)
            assert r.status_code == 201, r.text

    def good_started(self, rollout_id: int) -> None:
        self._phase_rollout["good"] = rollout_id
        self._all_ok("revoked", [shadow_report("clf", "2.0.0", "failed", kl=BAD_KL)])
        self._all_ok("not_offered", [shadow_report("clf", "2.0.0", "failed", kl=BAD_KL)])
        self._all_ok("contradicting", [shadow_report("clf", "2.0.0", "failed")])

    def honest_cycled(self, phase: str, device_id: str, index: int) -> None:
        if phase == "good" and index + 1 == REVOKE_AFTER:
            for d in self.groups["revoked"]:
                r = self.http.post(f"{self.url}/v1/devices/{d.device_id}/revoke",
                                   headers=self.ops, timeout=30)
                assert r.status_code == 200, r.text
        if index < REPLAY_FIRST:
            self._replay(device_id, self._phase_rollout[phase])

    def _replay(self, honest_id: str, rollout_id: int) -> None:
        with self.factory() as s:
            captured = list(s.scalars(select(db.TelemetryEvent.payload).where(
                db.TelemetryEvent.device_id == honest_id,
                db.TelemetryEvent.release_id == rollout_id)))
        if not captured:
            return
        for d in self.groups["replaying"]:
            r = self.send(d, captured)  # the honest reports, same ids, in its own batch
            assert r.status_code == 200, r.text
            self.replays["accepted"] += r.json()["accepted"]
            self.replays["duplicates"] += r.json()["duplicates"]
            self.replays["sent"] += 1
            r = self.send(d, captured, device_id=honest_id)  # as the honest device
            self.replays["refused"] += r.status_code == 401

    def bad_started(self, rollout_id: int) -> None:
        self._phase_rollout["bad"] = rollout_id
        for d in self.groups["revoked"]:
            r = self.send(d, [shadow_report("clf", "3.0.0", "passed")])
            self.revoked_refusals += r.status_code == 401
        self._all_ok("not_offered", [shadow_report("clf", "3.0.0", "passed")])
        self._all_ok("contradicting", [shadow_report("clf", "3.0.0", "passed", kl=BAD_KL)])

    def finished(self, good_id: int, bad_id: int) -> None:
        """One more round of lies against both outcomes (about the halted release only from
        devices never offered it: once halted it is offered to no one)."""
        self._all_ok("not_offered", [shadow_report("clf", "2.0.0", "failed", kl=BAD_KL),
                                     shadow_report("clf", "3.0.0", "passed")])
        self._all_ok("contradicting", [shadow_report("clf", "2.0.0", "failed")])

    # ------------------------------------------------------------------ what was stored

    def standings_of(self, group: list[FleetDevice], rollout_id: int) -> set[str | None]:
        with self.factory() as s:
            return set(s.scalars(select(db.TelemetryEvent.standing).where(
                db.TelemetryEvent.device_id.in_([d.device_id for d in group]),
                db.TelemetryEvent.release_id == rollout_id)))

    def votes_of(self, group: list[FleetDevice], rollout_id: int) -> int:
        with self.factory() as s:
            return len(list(s.scalars(select(db.DeviceRelease.device_id).where(
                db.DeviceRelease.device_id.in_([d.device_id for d in group]),
                db.DeviceRelease.release_id == rollout_id))))
