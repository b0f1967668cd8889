"""API tokens: creation, hashing, lookup, revocation and scope checks.

A token is `mf_` + 32 random bytes (url-safe base64); only its HMAC-SHA256 under the server's
pepper is stored (plain SHA-256 without one, in development), so a leaked database does not
leak usable tokens. The secret has 256 bits of entropy, so a fast keyed hash (no salt, no KDF)
is safe and lets us look tokens up by hash. `admin` implies every scope.

A token may expire (`expires_at`: refused from then on). An `enroll` token is the one every
app install carries, so anyone who unpacks the app has it: it enrols devices (within its
device quota and hourly rate, server/services/fleet/enrolment.py) and nothing else — every
read route refuses it (`require_reader`).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.db.models import ApiToken
from server.db.types import utcnow
from server.errors import (
    AuthenticationError,
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
)

TOKEN_PREFIX = "mf_"  # noqa: S105 - a public marker, not a secret


class Scope(enum.StrEnum):
    publish = "publish"  # create models, upload versions
    rollout = "rollout"  # channels, releases, rollout changes
    admin = "admin"  # everything, including token management
    enroll = "enroll"  # devices enrol their own key with it (POST /v1/devices/enroll), nothing else


def hash_token(token: str, pepper: str = "") -> str:
    """HMAC-SHA256 keyed with the server's pepper (`MODELFLEET_TOKEN_PEPPER`); plain SHA-256
    when no pepper is configured (development)."""
    if pepper:
        return hmac.new(pepper.encode(), token.encode(), hashlib.sha256).hexdigest()
    return hashlib.sha256(token.encode()).hexdigest()


def parse_scopes(values: Iterable[str]) -> list[str]:
    scopes: list[str] = []
    for value in values:
        try:
            scope = Scope(value.strip().lower())
        except ValueError:
            allowed = ", ".join(s.value for s in Scope)
            raise InvalidInputError(
                f"unknown scope {value!r}", field="scope", fix=f"use one of: {allowed}"
            ) from None
        if scope.value not in scopes:
            scopes.append(scope.value)
    if not scopes:
        raise InvalidInputError(
            "a token needs at least one scope",
            field="scope",
            fix="pass --scope publish (or rollout, admin, enroll)",
        )
    return scopes


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's id, name and scopes (and its enrolment limits)."""

    token_id: int
    name: str
    scopes: frozenset[str]
    device_quota: int | None = None
    enroll_per_hour: int | None = None

    @property
    def actor(self) -> str:
        return f"token:{self.token_id}" + (f":{self.name}" if self.name else "")

    def has(self, scope: str) -> bool:
        return Scope.admin.value in self.scopes or scope in self.scopes


def create_token(
    session: Session, scopes: Sequence[str], name: str = "", *, pepper: str = "",
    device_quota: int | None = None, expires_at: datetime | None = None,
    enroll_per_hour: int | None = None,
) -> tuple[ApiToken, str]:
    """Stores a new token and returns (row, secret). The secret is shown once, never stored.
    `device_quota` and `enroll_per_hour` bound what an `enroll` token may enrol."""
    parsed = parse_scopes(scopes)
    for what, value in (("device_quota", device_quota), ("enroll_per_hour", enroll_per_hour)):
        if value is not None and value < 1:
            raise InvalidInputError(f"{what} must be at least 1", field=what,
                                    fix="leave it out for no limit")
    if (device_quota is not None or enroll_per_hour is not None) and (
            Scope.enroll.value not in parsed):
        raise InvalidInputError("device quotas and enrolment rates are for enroll tokens",
                                field="device_quota", fix="add --scope enroll or drop them")
    if expires_at is not None and expires_at <= utcnow():
        raise InvalidInputError("expires_at is in the past", field="expires_at",
                                fix="give a time in the future")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(name=name, token_hash=hash_token(secret, pepper), prefix=secret[:10],
                   scopes=parsed, device_quota=device_quota, expires_at=expires_at,
                   enroll_per_hour=enroll_per_hour)
    session.add(row)
    session.flush()
    return row, secret


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))


def revoke_token(session: Session, token_id: int) -> ApiToken:
    row = session.get(ApiToken, token_id)
    if row is None:
        raise NotFoundError(f"no token with id {token_id}", fix="see `modelfleet tokens list`")
    if not row.revoked:
        row.revoked = True
        row.revoked_at = utcnow()
    return row


def authenticate(session: Session, authorization: str | None, *, pepper: str = "") -> Principal:
    """The principal for an `Authorization: Bearer <token>` header value."""
    if not authorization:
        raise AuthenticationError(
            "missing API token",
            fix="send 'Authorization: Bearer <token>'; create one with `modelfleet tokens create`",
        )
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise AuthenticationError(
            "malformed Authorization header", fix="use 'Authorization: Bearer <token>'"
        )
    digest = hash_token(token, pepper)
    row = session.scalars(select(ApiToken).where(ApiToken.token_hash == digest)).first()
    # compare_digest is belt and braces: the lookup is by hash, not by secret.
    if row is None or not hmac.compare_digest(row.token_hash, digest):
        raise AuthenticationError(
            "unknown API token", fix="check the token or create one with `modelfleet tokens create`"
        )
    if row.revoked:
        raise AuthenticationError(
            f"API token {row.prefix}… was revoked",
            fix="create a new one with `modelfleet tokens create`",
        )
    now = utcnow()
    if row.expires_at is not None and row.expires_at <= now:
        raise AuthenticationError(
            f"API token {row.prefix}… expired at {row.expires_at.isoformat()}",
            fix="create a new one with `modelfleet tokens create`")
    row.last_used_at = now
    return Principal(token_id=row.id, name=row.name, scopes=frozenset(row.scopes),
                     device_quota=row.device_quota, enroll_per_hour=row.enroll_per_hour)


def require_reader(principal: Principal) -> None:
    """Read routes: any scope but `enroll` alone (the token every app install carries must
    not let its holder list devices, channels, rollouts or the audit log)."""
    if not principal.scopes - {Scope.enroll.value}:
        raise PermissionDeniedError(
            "an enroll token enrols devices and nothing else; it cannot read",
            fix="use a publish, rollout or admin token (`modelfleet tokens create`)")


def require(principal: Principal, scope: str) -> None:
    if not principal.has(scope):
        have = ", ".join(sorted(principal.scopes)) or "none"
        raise PermissionDeniedError(
            f"this endpoint needs the {scope!r} scope; the token has: {have}",
            fix=f"create a token with `modelfleet tokens create --scope {scope}`",
        )
