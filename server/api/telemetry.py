"""Device enrolment, revocation and signed telemetry (docs/shadow.md).

- `POST /v1/devices/enroll` (token scope `enroll`): a device registers its own Ed25519 key;
- `POST /v1/devices/{device_id}/revoke` (scope `rollout`): its reports are refused from now on;
- `POST /v1/telemetry`: no bearer token — the device's signature over the exact body bytes
  (`X-Device-Id`, `X-Device-Signature`), verified before the body is parsed; the body is
  capped at `max_telemetry_body_bytes` (256 KiB) by the request guard before it is read
  (server/api/guard.py), then handed to `Fleet.receive` as the exact bytes. One ordinary
  route: the rate comes from the devices batching (up to 500 reports a request,
  client_sdk/telemetry.py) and the group commit (server/services/fleet/groupcommit.py).
A batch that brought a final verdict, a failure or a rollback is judged by the guard in the
same request, after its transaction committed, and the rollouts it touched take a due ramp
step if healthy (server/services/fleet/ramp.py) — both in `Fleet.receive`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from server.api.deps import EnrollPrincipal, FleetDep, RolloutPrincipal, ServicesDep
from server.api.errors import AUTH_ERRORS, CONFLICT, INVALID, NOT_FOUND, ErrorBody, error_response
from server.services.fleet import identity
from server.services.fleet.ingest import RateLimitedError

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


@router.post("/devices/enroll", status_code=201, responses={**AUTH_ERRORS, **CONFLICT, **INVALID,
                                                            200: {"model": EnrollOut}})
def enroll_device(body: EnrollIn, response: Response, principal: EnrollPrincipal,
                  services: ServicesDep) -> EnrollOut:
    """Register the device's key (201). The same id and key again: 200; another key for an
    enrolled id: 409 `device_key_mismatch`."""
    done = identity.enroll(services.session_factory, body.device_id, body.public_key,
                           body.profile.model_dump(), actor=principal.actor)
    if not done.created:
        response.status_code = 200
    return EnrollOut(device_id=done.device_id, keyid=done.keyid, enrolled_at=done.enrolled_at)


@router.post("/devices/{device_id}/revoke", responses={**AUTH_ERRORS, **NOT_FOUND})
def revoke_device(device_id: Annotated[str, Path(max_length=128)], principal: RolloutPrincipal,
                  services: ServicesDep) -> RevokeOut:
    """Refuse the device's telemetry from now on (401 `device_revoked`)."""
    at = identity.revoke(services.session_factory, device_id, actor=principal.actor)
    return RevokeOut(device_id=device_id, revoked_at=at)


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
    try:
        result = await service.receive(headers.get("x-device-id"),
                                       headers.get("x-device-signature"), body)
    except RateLimitedError as e:
        response = error_response(429, e.code, e.message, fix=e.fix)
        response.headers["Retry-After"] = str(e.retry_after)
        return response
    # Two integers: no JSON encoder, no response-model validation.
    return Response(b'{"accepted":%d,"duplicates":%d}' % (result.accepted, result.duplicates),
                    media_type="application/json")
