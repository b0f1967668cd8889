"""A rollout's telemetry over time (`GET /v1/rollouts/{id}/timeline`, the dashboard's charts):
the `telemetry_events` of its release counted per time bucket of the server's receive clock
(device clocks are not trusted for ordering a fleet) — update steps and the bytes they moved
by `via` (patch | full | held), shadow reports by verdict — and adoption: devices whose first
`activated` report arrived in the bucket, minus devices whose first `rolled_back` did.
Only reports that count (`standing` counted: server/services/fleet/standing.py) are
charted; the health shows the others apart.

Two aggregate queries (GROUP BY bucket), so the answer's size is bounded by the bucket count
(`MAX_BUCKETS`), never by the number of events; the window is the rollout's life so far."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BigInteger, Integer, cast, extract, func, literal_column, or_, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from server.db import models as db
from server.errors import InvalidInputError
from server.rollouts.errors import RolloutNotFoundError

MAX_BUCKETS = 1_000
AUTO_BUCKETS = 60  # the bucket size chosen when none is asked for aims at this many
MAX_BUCKET_SECONDS = 7 * 86_400
# Bucket sizes chosen automatically: round numbers a chart's axis can label.
NICE_SECONDS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1_800, 3_600, 7_200, 10_800,
                21_600, 43_200, 86_400, 172_800, 604_800)
UPDATE_EVENTS = ("downloaded", "verified", "activated", "rolled_back", "failed")
VIAS = ("patch", "full", "held")
VERDICTS = ("pending", "passed", "failed")


@dataclass
class Bucket:
    start: int  # Unix seconds
    events: dict[str, int] = field(default_factory=lambda: dict.fromkeys(UPDATE_EVENTS, 0))
    # Update reports that named a `via`, and the bytes they reported, per via.
    reports_via: dict[str, int] = field(default_factory=lambda: dict.fromkeys(VIAS, 0))
    bytes_via: dict[str, int] = field(default_factory=lambda: dict.fromkeys(VIAS, 0))
    shadow: dict[str, int] = field(default_factory=lambda: dict.fromkeys(VERDICTS, 0))
    adopted: int = 0  # devices first activated here
    rolled_back: int = 0  # devices first rolled back here
    adoption: int = 0  # running total: adopted minus rolled back up to this bucket's end


@dataclass(frozen=True)
class Timeline:
    rollout_id: int
    bucket_seconds: int
    start: int
    end: int
    buckets: list[Bucket]

    def as_dict(self) -> dict[str, Any]:
        return {"rollout_id": self.rollout_id, "bucket_seconds": self.bucket_seconds,
                "start": self.start, "end": self.end,
                "buckets": [vars(b) for b in self.buckets]}


def auto_bucket_seconds(span_seconds: int) -> int:
    """The smallest round bucket that covers the span in about AUTO_BUCKETS buckets."""
    want = max(1, math.ceil(span_seconds / AUTO_BUCKETS))
    return next((s for s in NICE_SECONDS if s >= want), NICE_SECONDS[-1])


def _epoch(column: Any, dialect: str) -> ColumnElement[int]:
    """Unix seconds of a timestamp column, as an integer, on either database."""
    if dialect == "postgresql":
        return cast(func.floor(extract("epoch", column)), BigInteger)
    return cast(func.strftime("%s", column), Integer)


def rollout_timeline(session: Session, rollout_id: int, *, bucket_seconds: int | None,
                     now: datetime | None = None) -> Timeline:
    """The rollout's timeline from its creation until `now`; see the module docstring.
    Raises RolloutNotFoundError, InvalidInputError (a bucket size that needs more than
    MAX_BUCKETS buckets)."""
    release = session.get(db.Release, rollout_id)
    if release is None:
        raise RolloutNotFoundError(f"no rollout with id {rollout_id}",
                                   fix="list rollouts with GET /v1/channels/{channel}/rollouts")
    end = int((now or datetime.now(UTC)).timestamp())
    begin = min(int(release.created_at.timestamp()), end)
    span = end - begin + 1
    if bucket_seconds is None:
        bucket_seconds = auto_bucket_seconds(span)
    count = math.ceil(span / bucket_seconds)
    if count > MAX_BUCKETS:
        raise InvalidInputError(
            f"bucket_seconds={bucket_seconds} needs {count} buckets for this rollout "
            f"(at most {MAX_BUCKETS})", field="bucket_seconds",
            fix=f"use bucket_seconds >= {math.ceil(span / MAX_BUCKETS)}, or omit it")
    start = begin - begin % bucket_seconds  # aligned, so refreshes keep the same buckets
    count = (end - start) // bucket_seconds + 1
    buckets = [Bucket(start + i * bucket_seconds) for i in range(count)]
    _count_events(session, rollout_id, start, bucket_seconds, buckets)
    _count_adoption(session, rollout_id, start, bucket_seconds, buckets)
    running = 0
    for b in buckets:
        running += b.adopted - b.rolled_back
        b.adoption = running
    return Timeline(rollout_id, bucket_seconds, start, end, buckets)


def _index(session: Session, column: Any, start: int, size: int) -> ColumnElement[Any]:
    dialect = session.get_bind().dialect.name
    # Integer division on both databases (operands are integers and never negative here).
    # Literals, not bound parameters: PostgreSQL matches GROUP BY to the select list by text.
    offset = _epoch(column, dialect) - literal_column(str(int(start)), BigInteger)
    return cast(offset // literal_column(str(int(size)), BigInteger), BigInteger).label("bucket")


def _counted() -> ColumnElement[bool]:
    """Reports that count (NULL: stored before standings existed, migration 0007)."""
    t = db.TelemetryEvent
    return or_(t.standing.is_(None), t.standing == "counted")


def _count_events(session: Session, rollout_id: int, start: int, size: int,
                  buckets: list[Bucket]) -> None:
    t = db.TelemetryEvent
    since = datetime.fromtimestamp(start, UTC)
    # The JSON fields in a subquery: the outer GROUP BY then names plain columns (a JSON path
    # is a bound parameter, which PostgreSQL would not match between SELECT and GROUP BY).
    inner = (select(_index(session, t.received_at, start, size), t.kind.label("kind"),
                    t.payload["via"].as_string().label("via"),
                    t.payload["verdict"].as_string().label("verdict"),
                    t.payload["bytes"].as_integer().label("bytes"))
             .where(t.release_id == rollout_id, t.received_at >= since, _counted(),
                    t.kind.in_(["shadow", *(f"update.{e}" for e in UPDATE_EVENTS)]))
             .subquery())
    c = inner.c
    rows = session.execute(
        select(c.bucket, c.kind, c.via, c.verdict, func.count(),
               func.coalesce(func.sum(c.bytes), 0))
        .group_by(c.bucket, c.kind, c.via, c.verdict)).all()
    for index, kind, via_value, verdict_value, n, total_bytes in rows:
        if not 0 <= index < len(buckets):
            continue  # received after `now` was read
        b = buckets[index]
        if kind == "shadow":
            if verdict_value in b.shadow:
                b.shadow[verdict_value] += n
            continue
        b.events[kind.removeprefix("update.")] += n
        if via_value in b.reports_via:
            b.reports_via[via_value] += n
            b.bytes_via[via_value] += int(total_bytes)


def _count_adoption(session: Session, rollout_id: int, start: int, size: int,
                    buckets: list[Bucket]) -> None:
    t = db.TelemetryEvent
    for kind, attr in (("update.activated", "adopted"), ("update.rolled_back", "rolled_back")):
        first = (select(func.min(t.received_at).label("at"))
                 .where(t.release_id == rollout_id, t.kind == kind, _counted())
                 .group_by(t.device_id).subquery())
        per_device = select(_index(session, first.c.at, start, size)).subquery()
        query = select(per_device.c.bucket, func.count()).group_by(per_device.c.bucket)
        for index, n in session.execute(query):
            if 0 <= index < len(buckets):
                setattr(buckets[index], attr, getattr(buckets[index], attr) + n)
