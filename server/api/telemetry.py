"""Device enrolment, revocation and signed telemetry (docs/shadow.md).

- `POST /v1/devices/enroll` (token scope `enroll`): a device registers its own Ed25519 key,
  within the token's device quota and hourly rate (server/services/fleet/enrolment.py);
- `POST /v1/devices/register` (scope `rollout`): an operator registers a device's key ahead
  of it — the only way to enrol an id a rollout pins (`device_allow`);
- `POST /v1/devices/{device_id}/revoke` (scope `rollout`): its reports are refused from now on;
- `POST /v1/devices/content-key`: no bearer token — signed like telemetry; a protected
  release's content key sealed to the device (server/services/fleet/content_keys.py);
- `POST /v1/telemetry`: no bearer token — the device's signature over the exact body bytes
  (`X-Device-Id`, `X-Device-Signature`), verified before the body is parsed; the body is
  capped at `max_telemetry_body_bytes` (256 KiB) by the request guard before it is read
  (server/api/body_limits.py), then handed to `Fleet.receive` as the exact bytes. One ordinary
  route: the rate comes from the devices batching (up to 500 reports a request,
  client_sdk/telemetry.py) and the group commit (server/services/fleet/groupcommit.py).
A batch that brought a final verdict, a failure or a rollback is judged by the guard in the
same request, after its transaction committed, and the rollouts it touched take a due ramp
step if healthy (server/rollouts/ramp.py) — both in `Fleet.receive`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from server.api.deps import EnrollPrincipal, FleetDep, RolloutPrincipal, ServicesDep
from server.api.errors import (
    AUTH_ERRORS,
    CONFLICT,
    INVALID,
    NOT_FOUND,
    ErrorBody,
)
from server.errors import NotFoundError, PayloadTooLargeError
from server.services.fleet import attestation, identity
from server.services.fleet.enrolment import Grant

router = APIRouter(prefix="/v1", tags=["fleet"])

Text = Annotated[str | None, Field(default=None, max_length=64)]


class ProfileIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    platform: str = Field(max_length=64, examples=["android"])
    soc: Text = None
    arch: Text = None
    os_version: Text = None
    app_version: Text = None


class EnrollIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device_id: str = Field(max_length=128, examples=["pixel-7-0042"])
    public_key: str = Field(max_length=64, description="raw Ed25519 public key, 64 lowercase hex")
    profile: ProfileIn
    box_public_key: str | None = Field(
        default=None, max_length=64,
        description="raw X25519 public key, 64 lowercase hex: protected releases' content "
        "keys are sealed to it (optional; agents that predate protection send none)")
    attestation: str | None = Field(
        default=None, max_length=16_384,
        description="the platform's attestation verdict for this id and key (Play Integrity "
        "/ App Attest style); checked only when the server has a provider configured")


class EnrollOut(BaseModel):
    device_id: str
    keyid: str
    enrolled_at: datetime


class RevokeOut(BaseModel):
    device_id: str
    revoked_at: datetime


class TelemetryOut(BaseModel):
    accepted: int
    duplicates: int


ENROL_ERRORS: dict[int | str, dict[str, Any]] = {
    **AUTH_ERRORS, **CONFLICT, **INVALID, 200: {"model": EnrollOut},
    429: {"model": ErrorBody, "description": "The token's hourly enrolment rate is used up; "
          "see Retry-After"}}


@router.post("/devices/enroll", status_code=201, response_model=EnrollOut,
             responses=ENROL_ERRORS)
def enroll_device(body: EnrollIn, response: Response, principal: EnrollPrincipal,
                  services: ServicesDep) -> EnrollOut:
    """Register the device's key (201). The same id and key again: 200; another key for an
    enrolled id: 409 `device_key_mismatch`; over the token's quota: 403
    `enrolment_quota_exhausted`; an id a rollout pins: 403 `device_id_pinned` (an operator
    registers it); refused attestation: 403 `attestation_refused`."""
    return _enrol(body, response, principal, services)


@router.post("/devices/register", status_code=201, response_model=EnrollOut,
             responses=ENROL_ERRORS)
def register_device(body: EnrollIn, response: Response, principal: RolloutPrincipal,
                    services: ServicesDep) -> EnrollOut:
    """An operator registers a device's key ahead of it (201; the same again: 200): no
    quota, and the way to enrol an id a rollout pins. The device's own enrolment with the
    same key is then a no-op."""
    return _enrol(body, response, principal, services)


def _enrol(body: EnrollIn, response: Response, principal: Any,
           services: ServicesDep) -> EnrollOut:
    # An EnrolmentRateError is answered by the error handler: 429 with Retry-After.
    done = identity.enroll(services.session_factory, body.device_id, body.public_key,
                           body.profile.model_dump(), actor=principal.actor,
                           grant=Grant.of(principal), attestor=services.fleet.attestor,
                           evidence=body.attestation, box_public_key=body.box_public_key)
    if not done.created:
        response.status_code = 200
    return EnrollOut(device_id=done.device_id, keyid=done.keyid, enrolled_at=done.enrolled_at)


@router.post("/devices/{device_id}/revoke", responses={**AUTH_ERRORS, **NOT_FOUND})
def revoke_device(device_id: Annotated[str, Path(max_length=128)], principal: RolloutPrincipal,
                  services: ServicesDep) -> RevokeOut:
    """Refuse the device's telemetry from now on (401 `device_revoked`)."""
    at = identity.revoke(services.session_factory, device_id, actor=principal.actor)
    return RevokeOut(device_id=device_id, revoked_at=at)


class AttestationIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    required: bool = Field(description="count only attested devices' reports on the channel")


class AttestationOut(BaseModel):
    channel: str
    required: bool


@router.put("/channels/{channel}/attestation",
            responses={**AUTH_ERRORS, **NOT_FOUND, **CONFLICT, **INVALID})
def set_channel_attestation(channel: Annotated[str, Path(max_length=64)], body: AttestationIn,
                            principal: RolloutPrincipal, services: ServicesDep
                            ) -> AttestationOut:
    """Require (or stop requiring) attestation on the channel: only attested devices'
    reports count toward its rollouts' health and guard. 409 `attestation_unavailable` when
    the server has no attestation provider."""
    required = attestation.set_required(services.session_factory, channel, body.required,
                                        attestor=services.fleet.attestor, actor=principal.actor)
    return AttestationOut(channel=channel, required=required)


TELEMETRY_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Unknown or revoked device, bad signature, or a "
          "stale batch (code device_unknown | device_revoked | device_signature_invalid | "
          "device_report_stale)"},
    422: {"model": ErrorBody, "description": "A report field is wrong: `field` names it"},
    429: {"model": ErrorBody, "description": "The device sends too often; see Retry-After"},
}


@router.post("/telemetry", response_model=TelemetryOut, responses=TELEMETRY_ERRORS,
             openapi_extra={"x-max-body-setting": "max_telemetry_body_bytes",
                            "requestBody": {"required": True, "content": {
                                "application/json": {"schema": {"type": "object"}}}}})
async def post_telemetry(request: Request, service: FleetDep) -> Response:
    """A signed batch of 1–500 reports (docs/shadow.md "Report schema"). Reports already
    stored are skipped and counted as `duplicates`."""
    body = await request.body()  # already read (and capped) by the request guard
    headers = request.headers
    # A RateLimitedError is answered by the error handler: 429 with Retry-After.
    result = await service.receive(headers.get("x-device-id"),
                                   headers.get("x-device-signature"), body)
    # Two integers: no JSON encoder, no response-model validation.
    return Response(b'{"accepted":%d,"duplicates":%d}' % (result.accepted, result.duplicates),
                    media_type="application/json")


class ContentKeyOut(BaseModel):
    model: str
    version: str
    sealed_key: str = Field(description="standard base64 of the content key sealed "
                            "(X25519 SealedBox) to the device's enrolled box_public_key")


@router.post("/devices/content-key", response_model=ContentKeyOut,
             responses={**TELEMETRY_ERRORS, **NOT_FOUND, **CONFLICT,
                        403: {"model": ErrorBody, "description": "The release's rule does "
                              "not offer it to this device (release_not_offered)"},
                        413: {"model": ErrorBody, "description": "Body over 4096 bytes"}},
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": {"type": "object"}}}}})
async def post_content_key(request: Request, service: FleetDep) -> Response:
    """A protected release's content key, sealed to the device (docs/security.md): signed
    like telemetry; body {device_id, channel, model, version, sent_at}. Only enrolled,
    unrevoked devices the release's rule offers it to get it."""
    grants = service.key_grants
    if grants is None:
        raise NotFoundError("this server protects no releases")
    body = await request.body()
    if len(body) > 4096:
        raise PayloadTooLargeError("a key request is at most 4096 bytes")
    got = await run_in_threadpool(grants.grant, request.headers.get("x-device-id"),
                                  request.headers.get("x-device-signature"), body)
    return JSONResponse({"model": got.model, "version": got.version,
                         "sealed_key": got.sealed_key})
