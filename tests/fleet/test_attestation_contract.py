"""The attestation seam (issue 20). The contract every `Attestor` keeps — evidence counts
only for the device id and key it was issued for — run against each implementation (the
test double today; a Play Integrity / App Attest adapter joins the list), then the seam end
to end: off by default, and a channel that requires attestation counts only attested
devices' reports."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from server.services.fleet.attestation import (
    AttestationRefusedError,
    Attestor,
    SharedSecretAttestor,
)
from tests.fleet.conftest import Fleet
from tests.fleet.test_forged_verdicts import SHADOW, stored
from tests.fleet.test_guard import rollout_state
from tests.support.fleet_devices import FleetDevice, shadow_report

# (attestor, issue(device_id, public_key) -> the evidence a genuine device gets)
Implementation = tuple[Attestor, Callable[[str, str], str]]


def _double() -> Implementation:
    double = SharedSecretAttestor(b"s" * 32)
    return double, double.issue


IMPLEMENTATIONS = [pytest.param(_double, id="shared-secret-double")]
KEY = "ab" * 32
OTHER_KEY = "cd" * 32


@pytest.mark.parametrize("make", IMPLEMENTATIONS)
def test_contract_genuine_evidence_is_accepted(make: Callable[[], Implementation]) -> None:
    attestor, issue = make()
    attestor.verify(device_id="dev-1", public_key=KEY, evidence=issue("dev-1", KEY))
    assert attestor.name


@pytest.mark.parametrize("make", IMPLEMENTATIONS)
@pytest.mark.parametrize("attack", ["another key", "another id", "altered", "empty",
                                    "another provider"])
def test_contract_evidence_not_issued_for_this_id_and_key_is_refused(
        make: Callable[[], Implementation], attack: str) -> None:
    attestor, issue = make()
    evidence = {"another key": issue("dev-1", OTHER_KEY), "another id": issue("dev-2", KEY),
                "altered": issue("dev-1", KEY)[:-1] + "0", "empty": "",
                "another provider": SharedSecretAttestor(b"x" * 32).issue("dev-1", KEY)
                }[attack]
    if attack == "altered" and evidence == issue("dev-1", KEY):
        evidence = evidence[:-1] + "1"
    with pytest.raises(AttestationRefusedError):
        attestor.verify(device_id="dev-1", public_key=KEY, evidence=evidence)


def _attestor(fleet: Fleet, attestor: Attestor | None) -> None:
    fleet.client.app.state.services.fleet.attestor = attestor  # type: ignore[attr-defined]


def test_attestation_is_off_by_default_and_cannot_be_required_without_a_provider(
        fleet: Fleet) -> None:
    assert fleet.client.app.state.services.fleet.attestor is None  # type: ignore[attr-defined]
    fleet.rollout("2.0")
    r = fleet.client.put("/v1/channels/prod/attestation", json={"required": True},
                         headers=fleet.ops)
    assert r.status_code == 409 and r.json()["code"] == "attestation_unavailable", r.text
    device = FleetDevice("sends-evidence")
    r = fleet.client.post("/v1/devices/enroll", json=device.enroll_body() | {
        "attestation": "whatever"}, headers={"Authorization": f"Bearer {fleet.enroll_token}"})
    assert r.status_code == 201  # ignored, not checked: no provider


def test_unattested_devices_do_not_count_on_a_channel_that_requires_attestation(
        fleet: Fleet) -> None:
    double = SharedSecretAttestor(b"k" * 32)
    _attestor(fleet, double)
    rollout = fleet.rollout("2.0", mode="shadow", shadow=SHADOW,
                            guard={"min_devices": 1, "max_fail_share": 0.5})
    r = fleet.client.put("/v1/channels/prod/attestation", json={"required": True},
                         headers=fleet.ops)
    assert r.status_code == 200 and r.json() == {"channel": "prod", "required": True}
    app = {"Authorization": f"Bearer {fleet.enroll_token}"}

    def enrol(device: FleetDevice, evidence: str | None) -> Any:
        body: dict[str, Any] = device.enroll_body()
        if evidence is not None:
            body["attestation"] = evidence
        return fleet.client.post("/v1/devices/enroll", json=body, headers=app)

    emulator, genuine, faker = (FleetDevice(n) for n in ("emulator", "genuine", "faker"))
    assert enrol(emulator, None).status_code == 201
    r = enrol(faker, double.issue("someone-else", faker.public_key))
    assert r.status_code == 403 and r.json()["code"] == "attestation_refused"
    assert enrol(genuine, double.issue(genuine.device_id, genuine.public_key)).status_code == 201
    fleet.client.app.state.services.fleet.ingest.offers.forget()  # type: ignore[attr-defined]
    bad = shadow_report("clf", "2.0", "failed", kl=90_000)
    fleet.send(emulator, [bad])
    assert rollout_state(fleet, rollout["id"])["state"] == "active"
    assert rollout_state(fleet, rollout["id"])["health"]["devices"]["unattested"] == 1
    fleet.send(genuine, [shadow_report("clf", "2.0", "failed", kl=90_000)])
    assert rollout_state(fleet, rollout["id"])["state"] == "halted"
    assert stored(fleet, rollout["id"]) == {"emulator": "unattested", "genuine": "counted"}
