"""The attestation seam: a platform's verdict that an enrolling device is a genuine install
of the app on a genuine device (Google Play Integrity, Apple App Attest), bound to the key
it enrols.

Off by default: no provider is configured (`Fleet.attestor` is None), evidence a device
sends is ignored and no device is attested. A deployment plugs a provider in by giving
`make_fleet` (server/wiring.py) an `Attestor`; a channel may then require attestation
(`PUT /v1/channels/{name}/attestation`, `set_required`), and only
attested devices' reports count on it (server/services/fleet/standing.py `unattested`).

Every provider must keep the contract tests/fleet/test_attestation_contract.py checks:
evidence is accepted only for the device id and public key it was issued for, and anything
else (another key, another id, altered or empty evidence) is refused with
`AttestationRefusedError`. `SharedSecretAttestor` is the test double: the "provider" signs
`device_id:public_key` with HMAC-SHA256 under a secret it shares with the server, the shape
of a provider's signed verdict over a nonce derived from the key.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from server.db import audit
from server.db import models as db
from server.errors import ConflictError, NotFoundError, PermissionDeniedError


class AttestationRefusedError(PermissionDeniedError):
    code = "attestation_refused"


class AttestationUnavailableError(ConflictError):
    code = "attestation_unavailable"


class Attestor(Protocol):
    """A provider's verifier. `name` is recorded as the device's `attested_by`."""

    name: str

    def verify(self, *, device_id: str, public_key: str, evidence: str) -> None:
        """Returns when `evidence` vouches for this device id and key; raises
        AttestationRefusedError (saying why) otherwise."""


def bound_nonce(device_id: str, public_key: str) -> bytes:
    """What a provider's verdict must be bound to: the device id and the key it enrols."""
    return hashlib.sha256(f"modelfleet-enrol:{device_id}:{public_key}".encode()).digest()


class SharedSecretAttestor:
    """The test double (see the module docstring). Evidence: hex HMAC-SHA256 of
    `bound_nonce` under the shared secret."""

    def __init__(self, secret: bytes, name: str = "test-double") -> None:
        if len(secret) < 16:
            raise ValueError("the shared secret must be at least 16 bytes")
        self._secret = secret
        self.name = name

    def issue(self, device_id: str, public_key: str) -> str:
        """What the provider hands a genuine device (tests play the provider)."""
        return hmac.new(self._secret, bound_nonce(device_id, public_key),
                        hashlib.sha256).hexdigest()

    def verify(self, *, device_id: str, public_key: str, evidence: str) -> None:
        if not evidence:
            raise AttestationRefusedError("no attestation evidence was sent",
                                          fix="send the provider's verdict as `attestation`")
        if not hmac.compare_digest(self.issue(device_id, public_key), evidence):
            raise AttestationRefusedError(
                "the attestation evidence does not vouch for this device id and key",
                fix="request a fresh verdict from the platform for this key and send it")


def set_required(factory: sessionmaker[Session], channel: str, required: bool, *,
                 attestor: Attestor | None, actor: str) -> bool:
    """Whether `channel` counts only attested devices' reports from now on (audited as
    `channel.attestation`). Requiring it with no provider configured is refused: no device
    could ever count."""
    if required and attestor is None:
        raise AttestationUnavailableError(
            "no attestation provider is configured on this server, so no device could count",
            fix="configure a provider (server/services/fleet/attestation.py) first")
    with factory() as session:
        row = session.scalars(select(db.Channel).where(db.Channel.name == channel)
                              .with_for_update()).first()
        if row is None:
            raise NotFoundError(f"no channel named {channel!r}", fix="list them: GET /v1/channels")
        if row.require_attestation != required:
            row.require_attestation = required
            audit.record(session, actor, "channel.attestation", f"channel:{channel}",
                         required=required,
                         **({"provider": attestor.name} if attestor is not None else {}))
        session.commit()
    return required
