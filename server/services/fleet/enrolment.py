"""Enrolment that cannot be farmed (docs/shadow.md "What a device can influence").

The `enroll` token ships inside every app, so it is public. What it may do is bounded here,
checked in the enrolment's own transaction (the token row locked, so concurrent enrolments
with one token are counted one after another):

- a device quota: at most `device_quota` devices enrolled with the token, ever (403
  `enrolment_quota_exhausted`);
- a rate: at most `enroll_per_hour` enrolments with it in any hour (429 `rate_limited`);
- an expiry (server/auth.py refuses an expired token before this runs);
- pinned ids: an id a release pins (`device_allow`) cannot be claimed with an app's token —
  whoever enrols it first would own its key and its pinned vote. It must be pre-registered
  with its public key by an operator (a token with the `rollout` scope:
  `POST /v1/devices/register`); the device then enrols with the same key as a no-op (403
  `device_id_pinned` otherwise).
- attestation (server/services/fleet/attestation.py): when the device sends evidence and a
  provider is configured, the verdict is recorded (`devices.attested_by`); a channel that
  requires attestation counts only attested devices' reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from server.auth import Principal, Scope
from server.db import models as db
from server.errors import PermissionDeniedError, RateLimitedError


class EnrolmentQuotaError(PermissionDeniedError):
    code = "enrolment_quota_exhausted"


class PinnedDeviceError(PermissionDeniedError):
    code = "device_id_pinned"


class EnrolmentRateError(RateLimitedError):
    """The enrolment token's hourly rate is spent."""


@dataclass(frozen=True)
class Grant:
    """What the caller's token allows: who enrols (None: an operator, not bound by quotas)
    and its limits."""

    token_id: int | None
    operator: bool
    device_quota: int | None = None
    per_hour: int | None = None

    @staticmethod
    def of(principal: Principal) -> Grant:
        operator = principal.has(Scope.rollout.value)
        return Grant(None if operator else principal.token_id, operator,
                     principal.device_quota, principal.enroll_per_hour)


def pinned_ids(session: Session) -> set[str]:
    """Every device id a release that is still offered pins."""
    ids: set[str] = set()
    for pinned in session.scalars(select(db.Release.pinned_devices).where(
            db.Release.state != db.ReleaseState.halted)):
        ids.update(pinned or ())
    return ids


def check_grant(session: Session, grant: Grant, device_id: str, now: datetime) -> None:
    """Refuses a new enrolment the grant does not allow (see the module docstring)."""
    if grant.operator:
        return
    if device_id in pinned_ids(session):
        raise PinnedDeviceError(
            f"device id {device_id!r} is pinned by a rollout and must be registered by an "
            "operator with its public key",
            fix="an operator registers it (POST /v1/devices/register with a rollout token "
            "and the device's public key); the device then enrols with that same key")
    if grant.token_id is None or (grant.device_quota is None and grant.per_hour is None):
        return
    session.get(db.ApiToken, grant.token_id, with_for_update=True)  # one count at a time
    by_token = select(func.count()).select_from(db.Device).where(
        db.Device.enrolled_by_token_id == grant.token_id)
    if grant.device_quota is not None:
        used = session.scalar(by_token) or 0
        if used >= grant.device_quota:
            raise EnrolmentQuotaError(
                f"this enrolment token has enrolled its quota of {grant.device_quota} devices",
                fix="issue a new enrolment token (modelfleet tokens create --scope enroll "
                "--device-quota N) for the next batch of installs")
    if grant.per_hour is not None:
        hour_ago = now - timedelta(hours=1)
        recent = list(session.scalars(
            select(db.Device.enrolled_at).where(db.Device.enrolled_by_token_id == grant.token_id,
                                                db.Device.enrolled_at > hour_ago)
            .order_by(db.Device.enrolled_at)))
        if len(recent) >= grant.per_hour:
            oldest = recent[-grant.per_hour]
            assert oldest is not None
            wait = max(1, int((oldest + timedelta(hours=1) - now).total_seconds()) + 1)
            raise EnrolmentRateError(
                f"this enrolment token enrols at most {grant.per_hour} devices an hour",
                retry_after=wait, fix=f"retry in {wait} s")
