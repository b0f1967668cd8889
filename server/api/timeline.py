"""`GET /v1/rollouts/{id}/timeline`: the rollout's telemetry per time bucket — update steps,
patch vs full bytes, shadow verdicts, adoption (server/services/timeline.py). Any token."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from server.api.deps import SessionDep, StrictQuery, TokenPrincipal
from server.api.errors import AUTH_ERRORS, INVALID, NOT_FOUND
from server.api.rollouts import RolloutId
from server.services import timeline as tl

router = APIRouter(prefix="/v1", tags=["rollouts"], dependencies=[StrictQuery])


class BucketPublic(BaseModel):
    start: int = Field(description="Unix seconds (server receive time)")
    events: dict[str, int] = Field(description="update reports per event: downloaded, "
                                   "verified, activated, rolled_back, failed")
    reports_via: dict[str, int] = Field(description="update reports naming patch|full|held")
    bytes_via: dict[str, int] = Field(description="bytes those reports moved, per via")
    shadow: dict[str, int] = Field(description="shadow reports per verdict")
    adopted: int = Field(description="devices whose first `activated` arrived here")
    rolled_back: int = Field(description="devices whose first `rolled_back` arrived here")
    adoption: int = Field(description="running total of adopted minus rolled back")


class TimelinePublic(BaseModel):
    rollout_id: int
    bucket_seconds: int
    start: int
    end: int
    buckets: list[BucketPublic] = Field(max_length=tl.MAX_BUCKETS)


@router.get("/rollouts/{rollout_id}/timeline", responses={**AUTH_ERRORS, **NOT_FOUND,
                                                           **INVALID})
def rollout_timeline(
    rollout_id: RolloutId,
    session: SessionDep,
    _principal: TokenPrincipal,
    bucket_seconds: Annotated[int | None, Query(
        ge=1, le=tl.MAX_BUCKET_SECONDS,
        description="omitted: a round size giving about 60 buckets")] = None,
) -> TimelinePublic:
    """The rollout's telemetry from its start until now, one entry per `bucket_seconds`
    (at most 1000 buckets: 422 naming the smallest size that fits)."""
    found = tl.rollout_timeline(session, rollout_id, bucket_seconds=bucket_seconds)
    return TimelinePublic.model_validate(found.as_dict())
