"""The telemetry batch a device sends (docs/shadow.md "Report schema"): strict JSON
(`manifests.strictjson`: no duplicate keys, no floats, safe integers only) validated field by
field; anything unknown or out of range refuses the whole batch (422 naming the field)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from manifests.errors import MalformedError
from manifests.strictjson import MAX_SAFE_INTEGER, loads
from server.errors import InvalidInputError

MAX_REPORTS_PER_BATCH = 500
NAME = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$"  # the manifests name rule (full match)
VERSION = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$"
SCHEMA_FIX = "send the report schema of docs/shadow.md"

Count = Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER)]
Signed = Annotated[int, Field(ge=-MAX_SAFE_INTEGER, le=MAX_SAFE_INTEGER)]
Reason = Annotated[str, Field(max_length=500)]


class _Report(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    id: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
    at: Count
    model: Annotated[str, Field(pattern=NAME)]
    version: Annotated[str, Field(pattern=VERSION)]
    artifact_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    channel: Annotated[str, Field(pattern=NAME)] | None = None


class UpdateReport(_Report):
    kind: Literal["update"]
    event: Literal["downloaded", "verified", "activated", "rolled_back", "failed"]
    via: Literal["patch", "full", "held"] | None = None
    bytes: Count | None = None
    reason: Reason | None = None


class ShadowReport(_Report):
    kind: Literal["shadow"]
    samples: Count
    dropped: Count
    kl_mean_micro: Count
    kl_max_micro: Count
    cosine_min_micro: Annotated[int, Field(ge=-1_000_000, le=1_000_000)] | None = None
    snr_min_centi_db: Signed | None = None
    active_p50_us: Count
    active_p99_us: Count
    candidate_p50_us: Count
    candidate_p99_us: Count
    verdict: Literal["pending", "passed", "failed"]
    reason: Reason | None = None


class HealthReport(_Report):
    kind: Literal["health"]
    predictions: Count
    errors: Count
    p99_us: Count | None = None
    rolled_back: bool


Report = Annotated[UpdateReport | ShadowReport | HealthReport, Field(discriminator="kind")]


class Batch(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    device_id: Annotated[str, Field(pattern=NAME)]
    sent_at: Count
    reports: Annotated[list[Report], Field(min_length=1, max_length=MAX_REPORTS_PER_BATCH)]


_BATCH = TypeAdapter(Batch)


def _field(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("update", "shadow", "health") and path.endswith("]"):
            continue  # the discriminator's branch name pydantic puts in the location
        else:
            path += f".{part}" if path else part
    return path or "body"


def parse_batch(body: bytes) -> Batch:
    """The batch in `body` (already size-capped and signature-checked), or
    InvalidInputError naming the first offending field."""
    try:
        document = loads(body, what="telemetry batch")
    except MalformedError as e:
        raise InvalidInputError(f"telemetry batch is not strict JSON: {e}", field="body",
                                fix=SCHEMA_FIX) from None
    try:
        return _BATCH.validate_python(document)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        name = _field(tuple(first["loc"]))
        if first["type"] in ("union_tag_invalid", "union_tag_not_found"):
            name += ".kind"
        raise InvalidInputError(f"telemetry batch: {name}: {first['msg']}", field=name,
                                fix=SCHEMA_FIX) from None
