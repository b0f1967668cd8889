"""Telemetry ingestion (`POST /v1/telemetry`): the body (already capped by the request guard)
is verified against the device's enrolled key before a byte of it is parsed, then rate
limited per device, parsed strictly (server/services/fleet/reports.py), checked for
staleness and stored in one transaction:

- the device row: refused (401) if revoked — checked in the same transaction, so nothing of a
  revoked device's batch is stored; `last_seen_at` and the versions it runs kept current;
- every report as one `telemetry_events` row, bulk inserted with ON CONFLICT (report_id) DO
  NOTHING — a report sent twice is stored once and counted as a duplicate;
- the device's standing per release (`device_releases`), one upsert per release, from the
  new reports only: what rollout health and the guard count, each device once. Only the
  reports that stand as `counted` (server/services/fleet/standing.py: the release was
  offered to the device, the verdict agrees with its figures) reach it; every report's
  standing is stored with its `telemetry_events` row.

No ORM object is made per report: Core inserts of plain dicts.
"""

from __future__ import annotations

import binascii
import functools
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, case, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from server.db import models as db
from server.errors import AuthenticationError, InvalidInputError, RateLimitedError
from server.observability.metrics import count_telemetry
from server.services.fleet.identity import DEVICE_ID, DeviceKeys, DeviceUnknownError
from server.services.fleet.offers import Offers, StandingMap
from server.services.fleet.reports import (
    Batch,
    HealthReport,
    ShadowReport,
    UpdateReport,
    parse_batch,
)

SIGNATURE_FIX = ("send X-Device-Id and X-Device-Signature: standard base64 of the Ed25519 "
                 "signature over the exact body bytes")
RELEASE_CACHE_SECONDS = 5.0
FAILING_EVENTS = ("failed", "rolled_back")
# (model, version, channel) of a report -> the release it is about (None: none known).
ReleaseMap = dict[tuple[str, str, str | None], int | None]


class DeviceRevokedAuthError(AuthenticationError):
    code = "device_revoked"


class DeviceSignatureMissingError(AuthenticationError):
    code = "device_signature_invalid"


class StaleReportError(AuthenticationError):
    code = "device_report_stale"


@dataclass(frozen=True)
class IngestResult:
    accepted: int
    duplicates: int
    # Releases whose guard may have changed (a new final verdict, failure or rollback).
    judged: frozenset[int]


class RateLimiter:
    """A token bucket per device: `rate` requests per second, bursts of `burst`."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.rate, self.burst, self.clock = rate, float(burst), clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, device_id: str) -> float:
        """0 when the request may go on, else the seconds until it may."""
        now = self.clock()
        with self._lock:
            tokens, last = self._buckets.get(device_id, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens < 1.0:
                self._buckets[device_id] = (tokens, now)
                return (1.0 - tokens) / self.rate
            self._buckets[device_id] = (tokens - 1.0, now)
            return 0.0


@dataclass(frozen=True)
class _Statements:
    """The three writes of a batch, built once per dialect (values come as parameters)."""

    events: Any
    shadow_standing: Any
    event_standing: Any


@functools.cache
def dialect_statements(dialect: str) -> _Statements:
    def insert(table: Any) -> Any:
        return postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)

    events = insert(db.TelemetryEvent).on_conflict_do_nothing(
        index_elements=["report_id"]).returning(db.TelemetryEvent.report_id)
    t = db.DeviceRelease.__table__
    ins = insert(t)
    newer = ins.excluded.shadow_at >= func.coalesce(t.c.shadow_at, -1)
    latest = {c: case((newer, ins.excluded[c]), else_=t.c[c]) for c in (
        "verdict", "shadow_at", "samples", "kl_mean_micro", "kl_max_micro", "active_p50_us",
        "candidate_p50_us", "candidate_p99_us")}
    shadow = ins.on_conflict_do_update(
        index_elements=["device_id", "release_id"],
        set_={**latest, "downloaded": True, "updated_at": ins.excluded.updated_at,
              "passed_at": func.coalesce(t.c.passed_at, ins.excluded.passed_at)})
    ins = insert(t)
    newer = ins.excluded.event_at >= func.coalesce(t.c.event_at, -1)
    event = ins.on_conflict_do_update(
        index_elements=["device_id", "release_id"],
        set_={"passed_at": func.coalesce(t.c.passed_at, ins.excluded.passed_at),
              "event": case((newer, ins.excluded.event), else_=t.c.event),
              "event_at": case((newer, ins.excluded.event_at), else_=t.c.event_at),
              "downloaded": or_(t.c.downloaded, ins.excluded.downloaded),
              "rolled_back": or_(t.c.rolled_back, ins.excluded.rolled_back),
              "updated_at": ins.excluded.updated_at})
    return _Statements(events, shadow, event)


def decode_signature(value: str | None) -> bytes:
    if not value:
        raise DeviceSignatureMissingError("missing X-Device-Signature header", fix=SIGNATURE_FIX)
    try:
        signature = binascii.a2b_base64(value.encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        signature = b""
    if len(signature) != 64:
        raise DeviceSignatureMissingError("X-Device-Signature is not a base64 Ed25519 signature",
                                          fix=SIGNATURE_FIX)
    return signature


class TelemetryIngest:
    """See the module docstring. One per API process (the key cache and buckets live here)."""

    def __init__(self, factory: sessionmaker[Session], *, rate_per_s: float, burst: int,
                 max_skew_s: int, clock: Callable[[], float] = time.time) -> None:
        self.factory = factory
        self.keys = DeviceKeys(factory)
        self.offers = Offers(factory)
        self.limiter = RateLimiter(rate_per_s, burst)
        self.max_skew_s = max_skew_s
        self.clock = clock
        self._releases: dict[tuple[str, str], tuple[float, list[tuple[str, int, bool]]]] = {}

    def forget(self) -> None:
        """Drop the cached report → release map and rules: called after every manifest this
        process publishes (server/wiring.py), so a device that acts on the new manifest is
        judged by it at once, not by a rule cached a moment before the change."""
        self._releases.clear()
        self.offers.forget()

    def ingest(self, device_id: str | None, signature: str | None, body: bytes) -> IngestResult:
        """The whole request on the calling thread: `admit`, then one transaction."""
        batch, received = self.admit(device_id, signature, body)
        return self._store(batch, received)

    def admit(self, device_id: str | None, signature: str | None,
              body: bytes) -> tuple[Batch, datetime]:
        """Everything before storing, in this order: the device id, the signature over the
        exact `body` (before a byte of it is parsed), the rate limit, the strict parse and the
        staleness check. The batch and the time it was received."""
        check_device_header(device_id)
        assert device_id is not None
        self.keys.verify(device_id, body, decode_signature(signature))
        wait = self.limiter.take(device_id)
        if wait > 0:
            seconds = max(1, int(wait + 0.999))
            raise RateLimitedError(
                f"device {device_id!r} sends faster than {self.limiter.rate:g} requests/s",
                retry_after=seconds, fix=f"batch reports and retry after {seconds} s")
        batch = parse_batch(body)
        if batch.device_id != device_id:
            raise InvalidInputError("device_id in the body differs from X-Device-Id",
                                    field="device_id", fix="send the same device id in both")
        now = self.clock()
        if abs(batch.sent_at - now) > self.max_skew_s:
            raise StaleReportError(
                f"sent_at is {int(batch.sent_at - now)} s from the server's clock (limit "
                f"±{self.max_skew_s} s): a replayed or delayed batch",
                fix="send pending reports in a new batch with the current time in sent_at")
        return batch, datetime.fromtimestamp(now, UTC)

    # ------------------------------------------------------------------ storing

    def cached_releases(self, batch: Batch) -> ReleaseMap | None:
        """The release of every report from the process cache, or None when one is missing
        or older than RELEASE_CACHE_SECONDS (then `load_releases`)."""
        now = time.monotonic()
        out: ReleaseMap = {}
        for r in batch.reports:
            key = (r.model, r.version, r.channel)
            if key not in out:
                hit = self._releases.get((r.model, r.version))
                if hit is None or hit[0] < now:
                    return None
                out[key] = _pick_release(hit[1], r.channel)
        return out

    def load_releases(self, batch: Batch, conn: Connection | None = None) -> ReleaseMap:
        """The release of every report, reading the ones the cache lacks (a session of its
        own unless `conn` is given)."""
        if conn is None:
            cached = self.cached_releases(batch)
            if cached is not None:
                return cached
            with self.factory() as session:
                return self.load_releases(batch, session.connection())
        return {(r.model, r.version, r.channel): self._release_for(
            conn, r.model, r.version, r.channel) for r in batch.reports}

    def _release_for(self, conn: Connection, model: str, version: str,
                     channel: str | None) -> int | None:
        """The release the report is about: on its channel when named, else the newest
        release of that version that is not halted (else the newest)."""
        key = (model, version)
        hit = self._releases.get(key)
        if hit is None or hit[0] < time.monotonic():
            rows = conn.execute(
                select(db.Channel.name, db.Release.id, db.Release.state == db.ReleaseState.halted)
                .join(db.Channel, db.Channel.id == db.Release.channel_id)
                .join(db.ModelVersion, db.ModelVersion.id == db.Release.version_id)
                .join(db.Model, db.Model.id == db.ModelVersion.model_id)
                .where(db.Model.name == model, db.ModelVersion.version == version)
                .order_by(db.Release.id.desc())).all()
            hit = (time.monotonic() + RELEASE_CACHE_SECONDS,
                   [(r[0], r[1], bool(r[2])) for r in rows])
            self._releases[key] = hit
        return _pick_release(hit[1], channel)

    def _store(self, batch: Batch, received: datetime) -> IngestResult:
        with self.factory() as session:
            conn = session.connection()
            # Seen now, unless revoked: one statement (and the device row locked until commit).
            active_before = conn.execute(
                update(db.Device).where(db.Device.id == batch.device_id,
                                        db.Device.revoked_at.is_(None))
                .values(last_seen_at=received).returning(db.Device.active_versions)
            ).scalar_one_or_none()
            if active_before is None:
                raise DeviceRevokedAuthError(f"device {batch.device_id!r} was revoked",
                                             fix="enrol the installation under a new device id")
            release_of = self.load_releases(batch, conn)
            standing = self.offers.classify(batch, release_of, conn)
            rows = [event_row(batch.device_id, r, release_of[(r.model, r.version, r.channel)],
                              received, standing[r.id]) for r in batch.reports]
            stmt = dialect_statements(conn.dialect.name).events
            new_ids = set(conn.execute(stmt, rows).scalars()) if rows else set()
            new = [r for r in batch.reports if r.id in new_ids]
            active = active_versions(dict(active_before), new)
            if active != active_before:
                conn.execute(update(db.Device).where(db.Device.id == batch.device_id)
                             .values(active_versions=active))
            standings = standing_rows(batch.device_id, new, release_of, received, standing)
            upserts = dialect_statements(conn.dialect.name)
            if standings.shadow:
                conn.execute(upserts.shadow_standing, standings.shadow)
            if standings.event:
                conn.execute(upserts.event_standing, standings.event)
            session.commit()
        return IngestResult(len(new), len(batch.reports) - len(new), standings.judged)


def _pick_release(releases: list[tuple[str, int, bool]], channel: str | None) -> int | None:
    if channel is not None:
        return next((rid for ch, rid, _ in releases if ch == channel), None)
    live = [rid for _, rid, halted in releases if not halted]
    candidates = live or [rid for _, rid, _ in releases]
    return candidates[0] if candidates else None


def check_device_header(device_id: str | None) -> None:
    if not device_id or not DEVICE_ID.fullmatch(device_id):
        raise DeviceUnknownError("missing or malformed X-Device-Id header", fix=SIGNATURE_FIX)


def accepted_reports(result: IngestResult) -> int:
    """How many reports a committed batch stored: the one call every 200 of
    `POST /v1/telemetry` passes through, on either storing path (a metrics counter hooks in
    here)."""
    count_telemetry(result.accepted, result.duplicates)
    return result.accepted


def event_row(device_id: str, r: UpdateReport | ShadowReport | HealthReport,
              release_id: int | None, received: datetime,
              standing: str | None = None) -> dict[str, Any]:
    kind, kl, latency, samples = event_columns(r)
    return {"report_id": r.id, "device_id": device_id, "release_id": release_id,
            "model": r.model, "version": r.version, "kind": kind, "kl_micro": kl,
            "latency_p99_us": latency, "samples": samples,
            "payload": r.model_dump(exclude_none=True), "received_at": received,
            "standing": standing}


def event_columns(r: UpdateReport | ShadowReport | HealthReport
                  ) -> tuple[str, int | None, int | None, int | None]:
    """The kind, kl_micro, latency_p99_us and samples columns of a report's
    `telemetry_events` row (both storing paths)."""
    if isinstance(r, ShadowReport):
        return r.kind, r.kl_mean_micro, r.candidate_p99_us, r.samples
    if isinstance(r, HealthReport):
        return r.kind, None, r.p99_us, None
    return f"update.{r.event}", None, None, None


def active_versions(active: dict[str, str],
                     reports: Sequence[UpdateReport | ShadowReport | HealthReport]
                     ) -> dict[str, str]:
    for r in sorted((r for r in reports if isinstance(r, UpdateReport)), key=lambda r: r.at):
        if r.event == "activated":
            active[r.model] = r.version
        elif r.event == "rolled_back" and active.get(r.model) == r.version:
            del active[r.model]
    return active


@dataclass(frozen=True)
class Standings:
    """The device_releases upserts of a batch's new reports, and the releases whose guard
    may have moved."""

    shadow: list[dict[str, Any]]
    event: list[dict[str, Any]]
    judged: frozenset[int]


def standing_rows(device_id: str,
                  reports: Iterable[UpdateReport | ShadowReport | HealthReport],
                  release_of: ReleaseMap, now: datetime, standing: StandingMap) -> Standings:
    """The device's row per release from its new counted reports (latest shadow summary,
    latest update event); the others are left out (stored, never counted)."""
    shadows: dict[int, ShadowReport] = {}
    events: dict[int, list[UpdateReport]] = {}
    judged: set[int] = set()
    for r in reports:
        rid = release_of[(r.model, r.version, r.channel)]
        if rid is None or standing.get(r.id) != "counted":
            continue
        if isinstance(r, ShadowReport):
            if rid not in shadows or r.at >= shadows[rid].at:
                shadows[rid] = r
            if r.verdict != "pending":
                judged.add(rid)
        elif isinstance(r, UpdateReport):
            events.setdefault(rid, []).append(r)
            if r.event in FAILING_EVENTS:
                judged.add(rid)
    shadow_rows = [{"device_id": device_id, "release_id": rid, "downloaded": True,
                    "rolled_back": False, "verdict": s.verdict, "shadow_at": s.at,
                    "samples": s.samples, "kl_mean_micro": s.kl_mean_micro,
                    "kl_max_micro": s.kl_max_micro, "active_p50_us": s.active_p50_us,
                    "candidate_p50_us": s.candidate_p50_us,
                    "candidate_p99_us": s.candidate_p99_us, "updated_at": now,
                    "passed_at": now if s.verdict == "passed" else None}
                   for rid, s in shadows.items()]
    event_rows = []
    for rid, evs in events.items():
        last = evs[0]
        for e in evs:  # the latest; on a tie the later one in the batch (sent in order)
            if e.at >= last.at:
                last = e
        event_rows.append({"device_id": device_id, "release_id": rid, "event": last.event,
                           "event_at": last.at, "updated_at": now,
                           "passed_at": now if last.event == "activated" else None,
                           "downloaded": any(e.event in ("downloaded", "verified", "activated")
                                             for e in evs),
                           "rolled_back": any(e.event == "rolled_back" for e in evs)})
    return Standings(shadow_rows, event_rows, frozenset(judged))
