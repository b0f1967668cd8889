"""The telemetry batch a device sends (docs/shadow.md "Report schema"): strict JSON
(`manifests.strictjson`: no duplicate keys, no floats, safe integers only) validated field by
field; anything unknown or out of range refuses the whole batch (422 naming the field).

Two ways to the same answer. The strict one parses with `manifests.strictjson` and validates
the objects. The fast one (≈ 2.5x cheaper per report, most of the ingest's parse cost)
validates the bytes with pydantic's own JSON parser, which on its own already refuses what
the strict rules refuse here except duplicate keys: a byte order mark, bytes that are not
UTF-8, control characters in strings, trailing text; and floats, NaN and integers outside
±(2^53-1) can fail only the schema, since every number in it is a bounded integer and no
field takes arbitrary JSON (a test keeps it so). What is left is checked on the bytes:
a `\\u` escape (lone surrogates are the strict parser's call) sends the body the strict way,
and so does any difference between the keys the batch holds and the key ends (`"` then `:`)
in the text — every key occurrence is one, so equal counts mean no key was given twice.
Whenever the fast way does not accept, the strict way answers, so every refusal and its
message are the strict way's.
"""

from __future__ import annotations

import re
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


# The end of a key: its closing quote, JSON whitespace, the colon (also matches inside
# strings, which only sends such a body the strict way). Without any whitespace byte in the
# body it is just `":`, counted at memchr speed.
_KEY_END = re.compile(rb'"[ \t\n\r]*:')
_WHITESPACE = (b" ", b"\t", b"\n", b"\r")


def _key_ends(body: bytes) -> int:
    if any(ws in body for ws in _WHITESPACE):
        return len(_KEY_END.findall(body))
    return body.count(b'":')


def parse_batch(body: bytes) -> Batch:
    """The batch in `body` (already size-capped and signature-checked), or
    InvalidInputError naming the first offending field."""
    batch = parse_batch_fast(body)
    return batch if batch is not None else parse_batch_strictly(body)


def parse_batch_fast(body: bytes) -> Batch | None:
    """The batch when the strict way would give this same batch, else None (see module)."""
    if b"\\u" in body:
        return None
    try:
        batch = _BATCH.validate_json(body)
    except ValidationError:
        return None
    keys = len(batch.__pydantic_fields_set__) + sum(
        len(r.__pydantic_fields_set__) for r in batch.reports)
    if _key_ends(body) != keys:
        return None
    return batch


def parse_batch_strictly(body: bytes) -> Batch:
    """`parse_batch` through `manifests.strictjson` and the objects' validation."""
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
