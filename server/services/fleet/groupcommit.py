"""Group commit of admitted telemetry batches into PostgreSQL (the production database).

Every request of one API process that is ready to store (signature verified, rate limited,
parsed, not stale: `TelemetryIngest.admit`) hands its batch to the process's
`GroupCommitter` and awaits the commit that contains its rows: a 200 still means the rows are
committed. While one group's transaction is in flight the next requests queue, and the next
group takes them all, so under load many requests share one BEGIN … COMMIT and one WAL flush.

One group is two round trips on one psycopg connection in pipeline mode (no pool, no
pre-ping), with one statement per step whatever the group's size: BEGIN and `STORE` (lock the
group's live devices in id order, set their last_seen_at, insert every report of a live device
with ON CONFLICT (report_id) DO NOTHING, return the devices' active versions and the new
report ids); then the two standings upserts, the changed `active_versions` and COMMIT. The
rows and rules are the ones of the generic path (server/services/fleet/ingest.py); the
standings upserts take their ON CONFLICT rules from its statements, compiled for psycopg.
The reports reach STORE as one text per column and one JSON array of payloads
(`_store_params`): no JSON row per report to encode in Python and parse in PostgreSQL.

Safety of sharing a transaction:
- a revoked device's batch stores nothing (STORE inserts only the rows of devices it
  locked as live) and answers 401; the others in the group commit;
- a device appears at most once per group (its next batch waits for the next group), so
  `active_versions` is computed from the row the group itself read;
- STORE locks the device rows in id order, so two processes' groups take them in one order
  and cannot deadlock each other;
- when a group's transaction fails on a connection that turns out dead (PostgreSQL
  restarted), it is retried once on a new connection; when it fails otherwise (a bad value),
  it is rolled back and each of its batches is retried alone, so one bad batch cannot fail
  the others. While PostgreSQL is down every batch answers 503 (server/db/outage.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Json
from pydantic_core import to_json
from sqlalchemy.dialects.postgresql import psycopg as pg_dialect

from server.db import models as db
from server.db.session import PG_CONNECT_TIMEOUT_S
from server.services.fleet.ingest import (
    DeviceRevokedAuthError,
    IngestResult,
    ReleaseMap,
    Standings,
    active_versions,
    dialect_statements,
    event_columns,
    standing_rows,
)
from server.services.fleet.offers import StandingMap
from server.services.fleet.reports import Batch, HealthReport, ShadowReport, UpdateReport

STORE = """
WITH seen AS (
    SELECT * FROM json_to_recordset(%(devices)s) AS v(id text, at timestamptz)),
locked AS (
    SELECT d.id FROM devices d JOIN seen ON seen.id = d.id WHERE d.revoked_at IS NULL
    ORDER BY d.id FOR UPDATE OF d),
live AS (
    UPDATE devices d SET last_seen_at = seen.at FROM locked JOIN seen ON seen.id = locked.id
    WHERE d.id = locked.id
    RETURNING d.id, d.active_versions, seen.at),
new AS (
    INSERT INTO telemetry_events (report_id, device_id, release_id, model, version, kind,
                                  kl_micro, latency_p99_us, samples, payload, received_at,
                                  standing)
    SELECT r.report_id, r.device_id, r.release_id, r.model, r.version, r.kind, r.kl_micro,
           r.latency_p99_us, r.samples, r.payload, live.at, r.standing
    FROM ROWS FROM (
        unnest(string_to_array(%(report_id)s::text, ',')),
        unnest(string_to_array(%(device_id)s::text, ',')),
        unnest(string_to_array(%(release_id)s::text, ',', 'null')::integer[]),
        unnest(string_to_array(%(model)s::text, ',')),
        unnest(string_to_array(%(version)s::text, ',')),
        unnest(string_to_array(%(kind)s::text, ',')),
        unnest(string_to_array(%(kl_micro)s::text, ',', 'null')::bigint[]),
        unnest(string_to_array(%(latency_p99_us)s::text, ',', 'null')::bigint[]),
        unnest(string_to_array(%(samples)s::text, ',', 'null')::integer[]),
        json_array_elements(%(payload)s::json),
        unnest(string_to_array(%(standing)s::text, ',', 'null'))
    ) AS r(report_id, device_id, release_id, model, version, kind, kl_micro, latency_p99_us,
           samples, payload, standing)
    JOIN live ON live.id = r.device_id
    ON CONFLICT (report_id) DO NOTHING
    RETURNING report_id, device_id)
SELECT id, active_versions, NULL FROM live
UNION ALL SELECT device_id, NULL, report_id FROM new
"""
SET_ACTIVE = """
UPDATE devices d SET active_versions = a.active
FROM json_to_recordset(%(rows)s) AS a(id text, active json) WHERE d.id = a.id
"""
MAX_GROUP_BATCHES = 256
MAX_GROUP_REPORTS = 5_000


@functools.cache
def _standing_upserts() -> tuple[str, str]:
    """The generic path's two device_releases upserts for a whole group: the rows come as one
    JSON parameter (`%(rows)s`), the ON CONFLICT rules are the generic statements' own."""
    statements = dialect_statements("postgresql")
    dialect = pg_dialect.dialect()  # type: ignore[no-untyped-call]  # SQLAlchemy's own
    table = db.DeviceRelease.__table__
    shadow = ["device_id", "release_id", "downloaded", "rolled_back", "verdict", "shadow_at",
              "samples", "kl_mean_micro", "kl_max_micro", "active_p50_us", "candidate_p50_us",
              "candidate_p99_us", "updated_at", "passed_at"]
    event = ["device_id", "release_id", "event", "event_at", "updated_at", "downloaded",
             "rolled_back", "passed_at"]

    def upsert(stmt: Any, columns: list[str]) -> str:
        compiled = stmt.compile(dialect=dialect, column_keys=columns)
        sql = str(compiled)
        rules = sql[sql.index(" ON CONFLICT "):]
        # The statement's own bound values (True, -1) written as SQL literals.
        for name, value in compiled.params.items():
            if name not in columns:
                literal = ("true" if value else "false") if isinstance(value, bool) else (
                    str(int(value)))
                rules = rules.replace(f"%({name})s", literal)
        types = ", ".join(f"{c} {table.c[c].type.compile(dialect)}" for c in columns)
        names = ", ".join(columns)
        # Only the code's own column names and types go into the text; values are parameters.
        return (f"INSERT INTO device_releases ({names}) SELECT {names} "  # noqa: S608
                f"FROM json_to_recordset(%(rows)s) AS s({types}){rules}")

    return upsert(statements.shadow_standing, shadow), upsert(statements.event_standing, event)


@dataclass
class _Pending:
    batch: Batch
    release_of: ReleaseMap
    standing: StandingMap
    received: datetime
    done: asyncio.Future[IngestResult]


@dataclass
class GroupStats:
    """Counts since start (tests read them to see that requests shared transactions)."""

    groups: int = 0
    batches: int = 0
    retried_alone: int = 0
    reconnects: int = 0  # groups retried on a new connection after the old one died


class GroupCommitter:
    """See the module docstring. One per API process; it binds to the event loop of its first
    `store` and is closed by `aclose` (the app's lifespan)."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._pending: deque[_Pending] = deque()
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._drainer: asyncio.Task[None] | None = None
        self.stats = GroupStats()

    async def store(self, batch: Batch, release_of: ReleaseMap, received: datetime, *,
                    standing: StandingMap) -> IngestResult:
        """Stores the batch in the next group's transaction; returns once it committed.
        `standing`: every report's (`Offers.classify`); only counted ones reach the
        standings."""
        done: asyncio.Future[IngestResult] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(batch, release_of, standing, received, done))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        return await done

    async def aclose(self) -> None:
        if self._drainer is not None:
            with contextlib.suppress(Exception):
                await self._drainer
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def _drain(self) -> None:
        while self._pending:
            await self._commit(self._take())

    def _take(self) -> list[_Pending]:
        group: list[_Pending] = []
        later: list[_Pending] = []
        devices: set[str] = set()
        reports = 0
        while self._pending and len(group) < MAX_GROUP_BATCHES:
            p = self._pending.popleft()
            if p.batch.device_id in devices:
                later.append(p)  # its device's row is already in this group
                continue
            if group and reports + len(p.batch.reports) > MAX_GROUP_REPORTS:
                later.append(p)
                break
            group.append(p)
            devices.add(p.batch.device_id)
            reports += len(p.batch.reports)
        self._pending.extendleft(reversed(later))
        return group

    async def _commit(self, group: list[_Pending]) -> None:
        try:
            outcomes = await self._transaction_on_live_connection(group)
        except Exception as e:
            if len(group) == 1:
                _settle(group[0], e)
                return
            # One bad batch (or a lost connection) must not fail the rest: each alone.
            self.stats.retried_alone += len(group)
            for p in group:
                try:
                    (outcome,) = await self._transaction([p])
                except Exception as alone:
                    outcome = alone
                _settle(p, outcome)
            return
        self.stats.groups += 1
        self.stats.batches += len(group)
        for p, outcome in zip(group, outcomes, strict=True):
            _settle(p, outcome)

    async def _transaction_on_live_connection(self, group: list[_Pending]
                                              ) -> list[IngestResult | Exception]:
        """`_transaction`, once more on a new connection when the one it used turns out
        dead: after PostgreSQL restarted, the idle connection fails at first use, and the
        first batch after the restart must not get a 503 for it. Safe to repeat: a report
        stored by a commit whose answer was lost is skipped by ON CONFLICT (report_id)."""
        try:
            return await self._transaction(group)
        except psycopg.OperationalError:
            if self._conn is None or not self._conn.broken:
                raise
            self.stats.reconnects += 1
            return await self._transaction(group)

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()
            # A bounded connect: while PostgreSQL is away each request fails fast (a 503,
            # server/db/outage.py) instead of hanging; the next one after it is back
            # reconnects here.
            dsn = self._dsn if "connect_timeout" in self._dsn else psycopg.conninfo.make_conninfo(
                self._dsn, connect_timeout=PG_CONNECT_TIMEOUT_S)  # the URL's own wins
            self._conn = conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        return conn

    async def _transaction(self, group: list[_Pending]) -> list[IngestResult | Exception]:
        conn = await self._connection()
        shadow_sql, event_sql = _standing_upserts()
        outcomes: list[IngestResult | Exception] = []
        async with conn.pipeline() as pipeline, conn.transaction():
            cursor = conn.cursor()
            await cursor.execute(STORE, _store_params(group))
            await pipeline.sync()
            active_of: dict[str, dict[str, str]] = {}
            new_ids: set[str] = set()
            for device_id, active, report_id in await cursor.fetchall():
                if report_id is None:
                    active_of[device_id] = active
                else:
                    new_ids.add(report_id)
            shadow: list[dict[str, Any]] = []
            event: list[dict[str, Any]] = []
            changed: list[dict[str, Any]] = []
            for p in group:
                before = active_of.get(p.batch.device_id)
                if before is None:
                    outcomes.append(DeviceRevokedAuthError(
                        f"device {p.batch.device_id!r} was revoked",
                        fix="enrol the installation under a new device id"))
                    continue
                result, standings, active = _outcome(p, before, new_ids)
                if active is not None:
                    changed.append({"id": p.batch.device_id, "active": active})
                shadow += standings.shadow
                event += standings.event
                outcomes.append(result)
            for sql, rows in ((shadow_sql, shadow), (event_sql, event), (SET_ACTIVE, changed)):
                if rows:
                    await conn.execute(sql, {"rows": Json(rows, dumps=_dumps)})
        return outcomes


def _dumps(value: Any) -> str:
    return json.dumps(value, default=_iso, separators=(",", ":"))


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _store_params(group: list[_Pending]) -> dict[str, Any]:
    """STORE's parameters: the devices as JSON, each `telemetry_events` column of every
    report as one comma-separated text, the payloads as one JSON array.

    Column texts instead of a JSON row per report: PostgreSQL splits them without a JSON
    parse (the JSON rows cost it a parse of every row plus one more of every payload) and
    Python joins them without a JSON encode. A comma cannot occur in any of the values: ids
    are hex, names and versions match reports.NAME / VERSION, kinds are the schema's words,
    numbers come from `to_json` (None as `null`, which string_to_array reads as NULL). The
    payloads are pydantic's own `exclude_none` serialization of the reports, the JSON of the
    generic path's `model_dump(exclude_none=True)`, key for key."""
    devices = []
    reports: list[UpdateReport | ShadowReport | HealthReport] = []
    columns: list[tuple[Any, ...]] = []
    for p in group:
        device = p.batch.device_id
        devices.append({"id": device, "at": p.received.isoformat()})
        release_of = p.release_of
        reports.extend(p.batch.reports)
        columns.extend((r.id, device, release_of[(r.model, r.version, r.channel)], r.model,
                        r.version, *event_columns(r), p.standing[r.id] or "null")
                       for r in p.batch.reports)
    ids, device_ids, releases, models, versions, kinds, kls, latencies, samples, standing = zip(
        *columns, strict=True)
    return {"devices": Json(devices, dumps=_dumps), "report_id": _texts(ids),
            "device_id": _texts(device_ids), "release_id": _numbers(releases),
            "model": _texts(models), "version": _texts(versions), "kind": _texts(kinds),
            "kl_micro": _numbers(kls), "latency_p99_us": _numbers(latencies),
            "samples": _numbers(samples), "standing": _texts(standing),
            "payload": to_json(reports, exclude_none=True).decode()}


def _texts(values: tuple[str, ...]) -> str:
    text = ",".join(values)
    # Cannot fail for validated reports (see _store_params); a count at memchr speed makes
    # sure that rows never shift against each other if that ever changed.
    if text.count(",") != len(values) - 1 or not all(values):
        raise ValueError("a telemetry_events text value is empty or holds a comma")
    return text


def _numbers(values: tuple[int | None, ...]) -> str:
    """`1,null,3`: the JSON array without its brackets."""
    return to_json(values)[1:-1].decode()


def _outcome(p: _Pending, active_before: dict[str, str], new_ids: set[str]
             ) -> tuple[IngestResult, Standings, dict[str, str] | None]:
    """The result, the standings rows and the new active versions (None: unchanged)."""
    new = [r for r in p.batch.reports if r.id in new_ids]
    active = active_versions(dict(active_before), new)
    standings = standing_rows(p.batch.device_id, new, p.release_of, p.received, p.standing)
    result = IngestResult(len(new), len(p.batch.reports) - len(new), standings.judged)
    return result, standings, (active if active != active_before else None)


def _settle(p: _Pending, outcome: IngestResult | Exception) -> None:
    if p.done.done():  # the request was cancelled (client gone); its rows stand
        return
    if isinstance(outcome, Exception):
        p.done.set_exception(outcome)
    else:
        p.done.set_result(outcome)
