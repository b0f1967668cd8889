"""`GET /v1/devices`: the devices the server has seen (what rollout previews run against),
most recently seen first. Read-only; any valid token."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel

from server.api.deps import SessionDep, StrictQuery, TokenPrincipal
from server.api.errors import AUTH_ERRORS
from server.services.devices import recently_seen

router = APIRouter(prefix="/v1", tags=["devices"], dependencies=[StrictQuery])


class DevicePublic(BaseModel):
    id: str
    profile: dict[str, Any]  # platform, soc, arch, os_version, app_version as last reported
    first_seen_at: datetime
    last_seen_at: datetime


class DevicePage(BaseModel):
    devices: list[DevicePublic]


@router.get("/devices", responses={**AUTH_ERRORS})
def list_devices(
    session: SessionDep,
    _principal: TokenPrincipal,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> DevicePage:
    rows = recently_seen(session, limit=limit, offset=offset)
    return DevicePage(devices=[DevicePublic(id=d.id, profile=d.profile or {},
                                            first_seen_at=d.first_seen_at,
                                            last_seen_at=d.last_seen_at) for d in rows])
