"""Content keys for devices (docs/security.md): `POST /v1/devices/content-key`.

A device asks for the content key of one protected release with a request signed like its
telemetry (X-Device-Id, X-Device-Signature over the exact body, verified before the body is
parsed; `sent_at` within the telemetry skew). The key is given — sealed (pynacl
`SealedBox`) to the X25519 key the device enrolled, so only that device can open it — only
when, in this order:

- the device is enrolled (401 `device_unknown`) and not revoked (401 `device_revoked`),
  and enrolled an X25519 key (409 `device_box_key_missing`: an agent that predates it);
- the channel offers that version and it is protected (404 `release_not_found`);
- the release's rule offers it to the device as it enrolled (its stored profile, not what
  the request claims), the same check that decides whether its reports count
  (server/services/fleet/standing.py `offered`): else 403 `release_not_offered` — a halted
  release is offered to nobody.

Each grant is audited (device, release; never the key).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from server.db import audit
from server.db import models as db
from server.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
)
from server.publish.protection import ContentKeys, seal_to_device
from server.services.fleet.identity import DeviceKeys
from server.services.fleet.ingest import (
    DeviceRevokedAuthError,
    StaleReportError,
    check_device_header,
    decode_signature,
)
from server.services.fleet.offers import load_facts, load_rule
from server.services.fleet.standing import offered

FIELDS = ("device_id", "channel", "model", "version", "sent_at")


class BoxKeyMissingError(ConflictError):
    code = "device_box_key_missing"


class ReleaseNotFoundError(NotFoundError):
    code = "release_not_found"


class NotOfferedError(PermissionDeniedError):
    code = "release_not_offered"


@dataclass(frozen=True)
class KeyRequest:
    device_id: str
    channel: str
    model: str
    version: str
    sent_at: int


@dataclass(frozen=True)
class Grant:
    model: str
    version: str
    sealed_key: str  # standard base64 of the SealedBox


def parse_request(body: bytes) -> KeyRequest:
    try:
        doc = json.loads(body)
    except ValueError as e:
        raise InvalidInputError(f"the body is not JSON ({e})", fix="send a JSON object") from e
    if not isinstance(doc, dict) or set(doc) != set(FIELDS):
        raise InvalidInputError("the body must hold exactly " + ", ".join(FIELDS),
                                fix="send {device_id, channel, model, version, sent_at}")
    for name in FIELDS[:4]:
        if not isinstance(doc[name], str) or not 0 < len(doc[name]) <= 128:
            raise InvalidInputError(f"{name} must be a short string", field=name)
    if not isinstance(doc["sent_at"], int) or isinstance(doc["sent_at"], bool):
        raise InvalidInputError("sent_at must be an integer (Unix seconds)", field="sent_at")
    return KeyRequest(doc["device_id"], doc["channel"], doc["model"], doc["version"],
                      doc["sent_at"])


class KeyGrants:
    """See the module docstring. One per API process (shares the device key cache)."""

    def __init__(self, factory: sessionmaker[Session], keys: DeviceKeys,
                 content_keys: ContentKeys, *, max_skew_s: int,
                 clock: Callable[[], float] = time.time) -> None:
        self.factory = factory
        self.keys = keys
        self.content_keys = content_keys
        self.max_skew_s = max_skew_s
        self.clock = clock

    def grant(self, device_id: str | None, signature: str | None, body: bytes) -> Grant:
        check_device_header(device_id)
        assert device_id is not None
        self.keys.verify(device_id, body, decode_signature(signature))
        req = parse_request(body)
        if req.device_id != device_id:
            raise InvalidInputError("device_id in the body differs from X-Device-Id",
                                    field="device_id", fix="send the same device id in both")
        if abs(req.sent_at - self.clock()) > self.max_skew_s:
            raise StaleReportError(
                f"sent_at is {int(req.sent_at - self.clock())} s from the server's clock "
                f"(limit ±{self.max_skew_s} s): a replayed or delayed request",
                fix="sign a new request with the current time in sent_at")
        with self.factory() as session:
            device = session.get(db.Device, device_id)
            assert device is not None  # verify() found its key
            if device.revoked_at is not None:
                raise DeviceRevokedAuthError(f"device {device_id!r} was revoked",
                                             fix="enrol the installation under a new id")
            if device.box_public_key is None:
                raise BoxKeyMissingError(
                    f"device {device_id!r} enrolled no X25519 key, so no content key can be "
                    "sealed to it", fix="update the app; a new agent enrols one")
            release = self._release(session, req)
            rule = load_rule(session, release.id)
            if rule is None or not offered(rule, load_facts(session.connection(), device_id)):
                raise NotOfferedError(
                    f"{req.model} {req.version} on {req.channel} is not offered to device "
                    f"{device_id!r}", fix="a device gets the key of what its rule offers it")
            key = self.content_keys.key_for(session, release.version_id)
            sealed_key = seal_to_device(key, device.box_public_key)
            audit.record(session, f"device:{device_id}", "content_key.grant",
                         f"{req.model}/{req.version}", channel=req.channel)
            session.commit()
        return Grant(req.model, req.version, base64.b64encode(sealed_key).decode("ascii"))

    @staticmethod
    def _release(session: Session, req: KeyRequest) -> db.Release:
        release = session.scalars(
            select(db.Release)
            .join(db.Channel, db.Channel.id == db.Release.channel_id)
            .join(db.ModelVersion, db.ModelVersion.id == db.Release.version_id)
            .join(db.Model, db.Model.id == db.ModelVersion.model_id)
            .where(db.Channel.name == req.channel, db.Model.name == req.model,
                   db.ModelVersion.version == req.version,
                   db.ModelVersion.protected.is_(True))).first()
        if release is None:
            raise ReleaseNotFoundError(
                f"channel {req.channel!r} offers no protected {req.model} {req.version}",
                fix="ask for a release the channel's manifest lists with a sealed artifact")
        return release
