"""Device identity: a device enrols its own Ed25519 public key once (with an `enroll` token,
within its limits: server/services/fleet/enrolment.py; or an operator registers it), and its
telemetry is then verified against that key. Revocation is checked in the telemetry
transaction itself, so it takes effect on the next report; the key, which never changes for
an enrolled device, is cached per process as a ready `VerifyKey`."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from manifests.keys import key_id
from server.db import audit
from server.db import models as db
from server.db.types import utcnow
from server.errors import AuthenticationError, ConflictError, InvalidInputError, NotFoundError
from server.services.fleet.attestation import Attestor
from server.services.fleet.enrolment import Grant, check_grant

DEVICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")  # the manifests name rule
PUBLIC_KEY = re.compile(r"[0-9a-f]{64}")
PROFILE_FIELDS = ("platform", "soc", "arch", "os_version", "app_version")


class DeviceKeyMismatchError(ConflictError):
    code = "device_key_mismatch"


class DeviceRevokedError(ConflictError):
    code = "device_revoked"


class DeviceUnknownError(AuthenticationError):
    code = "device_unknown"


class DeviceSignatureError(AuthenticationError):
    code = "device_signature_invalid"


@dataclass(frozen=True)
class Enrolment:
    device_id: str
    keyid: str
    enrolled_at: datetime
    created: bool  # False: the same device enrolled again with the same key


def check_device_id(device_id: str, field: str = "device_id") -> None:
    if not DEVICE_ID.fullmatch(device_id):
        raise InvalidInputError(
            f"device id {device_id[:140]!r} is not allowed", field=field,
            fix="1–128 letters, digits, '.', '_', '+' or '-', starting with a letter or digit")


def enroll(factory: sessionmaker[Session], device_id: str, public_key: str,
           profile: dict[str, Any], *, actor: str, grant: Grant,
           attestor: Attestor | None = None, evidence: str | None = None,
           box_public_key: str | None = None) -> Enrolment:
    """Registers the device's key, if `grant` allows a new device (enrolment.check_grant).
    The same id with the same key again is a no-op (the device retried, or enrols after an
    operator registered it); with another key it is refused (409): a key is never replaced.
    With an `attestor` and `evidence`, the provider's verdict is checked first (403 when it
    refuses) and recorded. `box_public_key`: the device's X25519 key, which protected
    releases' content keys are sealed to (optional: older agents send none; one that enrolled
    without may add it later by enrolling again with the same Ed25519 key)."""
    check_device_id(device_id)
    if not PUBLIC_KEY.fullmatch(public_key):
        raise InvalidInputError("public_key must be the raw Ed25519 key as 64 lowercase hex",
                                field="public_key", fix="send bytes(verify_key).hex()")
    if box_public_key is not None and not PUBLIC_KEY.fullmatch(box_public_key):
        raise InvalidInputError("box_public_key must be the raw X25519 key as 64 lowercase hex",
                                field="box_public_key", fix="send bytes(public_key).hex()")
    VerifyKey(bytes.fromhex(public_key))  # a 32-byte key always loads; fails loudly otherwise
    keyid = key_id(bytes.fromhex(public_key))
    clean = {name: profile.get(name) for name in PROFILE_FIELDS if profile.get(name)}
    attested_by = None
    if attestor is not None and evidence is not None:
        attestor.verify(device_id=device_id, public_key=public_key, evidence=evidence)
        attested_by = attestor.name
    for attempt in range(2):
        with factory() as session:
            row = session.get(db.Device, device_id, with_for_update=True)
            if row is not None and row.public_key is not None:
                again = _again(row, public_key, box_public_key)
                if box_public_key is not None and row.box_public_key is None:
                    row.box_public_key = box_public_key
                    audit.record(session, actor, "device.box_key", f"device:{device_id}")
                    session.commit()
                return again
            now = utcnow()
            check_grant(session, grant, device_id, now)
            if row is None:
                row = db.Device(id=device_id, first_seen_at=now, last_seen_at=now,
                                active_versions={})
                session.add(row)
            row.profile, row.public_key, row.keyid, row.enrolled_at = (
                clean, public_key, keyid, now)
            row.enrolled_by_token_id, row.attested_by = grant.token_id, attested_by
            row.box_public_key = box_public_key
            audit.record(session, actor, "device.enroll", f"device:{device_id}", keyid=keyid,
                         profile=clean, by_operator=grant.operator,
                         **({"attested_by": attested_by} if attested_by else {}))
            try:
                session.commit()
            except IntegrityError:  # a concurrent enrolment of the same id won the insert
                if attempt:
                    raise
                continue
            return Enrolment(device_id, keyid, now, created=True)
    raise AssertionError("unreachable")


def _again(row: db.Device, public_key: str, box_public_key: str | None) -> Enrolment:
    if row.public_key != public_key or (
            box_public_key is not None and row.box_public_key not in (None, box_public_key)):
        raise DeviceKeyMismatchError(
            f"device {row.id!r} is enrolled with another key (keyid {row.keyid})",
            fix="a device keeps its first key; give a new installation a new device id, or "
            "revoke the old one and enrol under a new id")
    if row.revoked_at is not None:
        raise DeviceRevokedError(f"device {row.id!r} was revoked",
                                 fix="enrol the installation under a new device id")
    assert row.keyid is not None and row.enrolled_at is not None
    return Enrolment(row.id, row.keyid, row.enrolled_at, created=False)


def revoke(factory: sessionmaker[Session], device_id: str, *, actor: str) -> datetime:
    """Refuses the device's reports from now on (401). Revoking twice keeps the first time."""
    with factory() as session:
        row = session.get(db.Device, device_id, with_for_update=True)
        if row is None or row.public_key is None:
            raise NotFoundError(f"no enrolled device {device_id!r}",
                                fix="list devices with GET /v1/devices")
        if row.revoked_at is None:
            row.revoked_at = utcnow()
            audit.record(session, actor, "device.revoke", f"device:{device_id}")
        revoked_at = row.revoked_at
        session.commit()
    return revoked_at


class DeviceKeys:
    """device id -> `VerifyKey`, loaded once per process (a device's key never changes)."""

    def __init__(self, factory: sessionmaker[Session]) -> None:
        self._factory = factory
        self._keys: dict[str, VerifyKey] = {}
        self._lock = threading.Lock()

    def cached(self, device_id: str) -> bool:
        """True when `verify` needs no database read for this device."""
        return device_id in self._keys

    def get(self, device_id: str) -> VerifyKey:
        key = self._keys.get(device_id)
        if key is not None:
            return key
        with self._factory() as session:
            public = session.scalars(select(db.Device.public_key)
                                     .where(db.Device.id == device_id)).first()
        if public is None:
            raise DeviceUnknownError(f"device {device_id[:140]!r} is not enrolled",
                                     fix="enrol it first: POST /v1/devices/enroll")
        key = VerifyKey(bytes.fromhex(public))
        with self._lock:
            self._keys[device_id] = key
        return key

    def verify(self, device_id: str, body: bytes, signature: bytes) -> None:
        """DeviceSignatureError unless `signature` is the device's over exactly `body`."""
        key = self.get(device_id)
        try:
            key.verify(body, signature)
        except BadSignatureError:
            raise DeviceSignatureError(
                "the report signature does not verify with the device's enrolled key",
                fix="sign the exact body bytes with the device key (Ed25519), standard base64 "
                "in X-Device-Signature") from None
