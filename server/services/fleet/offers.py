"""The facts a report's standing is judged from (server/services/fleet/standing.py), loaded
and cached per API process: each release's rule as the manifest offers it (kept for
RULE_CACHE_SECONDS, like the report → release map) and each device's enrolled profile and
attestation (cached for good: they are written once, at enrolment, and never change).

A cached rule can be older than the manifest a device just received (a ramp step, a new
pin, in this process or another replica). A publish in this process drops the cache
(`TelemetryIngest.forget`, subscribed to the publisher). For a change published elsewhere, a
report the cached rule does not offer is judged again against the rule read afresh (at most
once per RECHECK_SECONDS per release, so a device that is really not offered costs no more
than that): a device is not refused a vote because this process had not yet seen the change
that offered it, except in the RECHECK_SECONDS after a load when another process published
the change."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Connection, select
from sqlalchemy.orm import Session, sessionmaker

from server.db import models as db
from server.publish.publisher import load_artifact_records, release_record
from server.rollouts.preview import profile_from_dict
from server.services.fleet.reports import Batch
from server.services.fleet.standing import (
    NOT_OFFERED,
    DeviceFacts,
    ReleaseRule,
    StandingName,
    standing_of,
)

RULE_CACHE_SECONDS = 5.0
RECHECK_SECONDS = 0.5
# report id -> its standing (None: the report names no known release).
StandingMap = dict[str, StandingName | None]
ReleaseIds = Mapping[tuple[str, str, str | None], int | None]


def load_rule(session: Session, release_id: int) -> ReleaseRule | None:
    """The release's rule, or None when there is no such release."""
    row = session.execute(
        select(db.Release, db.ModelVersion.version, db.Model.name, db.Channel.require_attestation)
        .join(db.ModelVersion, db.ModelVersion.id == db.Release.version_id)
        .join(db.Model, db.Model.id == db.ModelVersion.model_id)
        .join(db.Channel, db.Channel.id == db.Release.channel_id)
        .where(db.Release.id == release_id)).first()
    if row is None:
        return None
    release, version, model, attest = row
    record = release_record(release, model, version)
    offered = None
    if release.state is not db.ReleaseState.halted:
        artifacts = load_artifact_records(session, release.version_id, "")
        offered = release_record(release, model, version, artifacts).manifest_release()
    return ReleaseRule(release_id, offered, record.shadow, bool(attest))


def load_facts(conn: Connection, device_id: str) -> DeviceFacts:
    row = conn.execute(select(db.Device.profile, db.Device.attested_by)
                       .where(db.Device.id == device_id)).first()
    profile: dict[str, Any] = (row.profile or {}) if row is not None else {}
    return DeviceFacts(profile_from_dict(device_id, profile),
                       attested=row is not None and row.attested_by is not None)


class Offers:
    """See the module docstring. `classify` gives every report of a batch its standing."""

    def __init__(self, factory: sessionmaker[Session],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.factory = factory
        self.clock = clock
        self._rules: dict[int, tuple[float, ReleaseRule | None]] = {}
        self._facts: dict[str, DeviceFacts] = {}
        self._lock = threading.Lock()

    def forget(self, release_id: int | None = None) -> None:
        """Drop cached rules (all, or one release's): the next report reads them again."""
        with self._lock:
            if release_id is None:
                self._rules.clear()
            else:
                self._rules.pop(release_id, None)

    def cached(self, batch: Batch, release_of: ReleaseIds) -> StandingMap | None:
        """The standings from the cache alone; None when a rule or the device is missing,
        or when a report comes out not offered (then `classify` checks the rule afresh)."""
        facts = self._facts.get(batch.device_id)
        if facts is None:
            return None
        now = self.clock()
        rules: dict[int, ReleaseRule | None] = {}
        for rid in {release_of[(r.model, r.version, r.channel)] for r in batch.reports}:
            if rid is None:
                continue
            hit = self._rules.get(rid)
            if hit is None or hit[0] < now:
                return None
            rules[rid] = hit[1]
        out = _standings(batch, release_of, rules, facts)
        return None if NOT_OFFERED in out.values() else out

    def classify(self, batch: Batch, release_of: ReleaseIds,
                 conn: Connection | None = None) -> StandingMap:
        """Every report's standing, reading what the cache lacks (in a session of its own
        unless `conn` is given)."""
        cached = self.cached(batch, release_of)
        if cached is not None:
            return cached
        if conn is None:
            with self.factory() as session:
                return self.classify(batch, release_of, session.connection())
        facts = self._facts.get(batch.device_id)
        if facts is None:
            facts = load_facts(conn, batch.device_id)
            with self._lock:
                self._facts[batch.device_id] = facts
        ids = {release_of[(r.model, r.version, r.channel)] for r in batch.reports}
        rules = {rid: self._rule(conn, rid) for rid in sorted(i for i in ids if i is not None)}
        out = _standings(batch, release_of, rules, facts)
        stale = {release_of[(r.model, r.version, r.channel)] for r in batch.reports
                 if out[r.id] == NOT_OFFERED}
        for rid in sorted(i for i in stale if i is not None):
            hit = self._rules[rid]
            if hit[0] - RULE_CACHE_SECONDS + RECHECK_SECONDS <= self.clock():  # loaded a while ago
                rules[rid] = self._rule(conn, rid, fresh=True)
        return _standings(batch, release_of, rules, facts) if stale else out

    def _rule(self, conn: Connection, release_id: int, *,
              fresh: bool = False) -> ReleaseRule | None:
        now = self.clock()
        hit = self._rules.get(release_id)
        if fresh or hit is None or hit[0] < now:
            with Session(bind=conn) as session:
                hit = (now + RULE_CACHE_SECONDS, load_rule(session, release_id))
            with self._lock:
                self._rules[release_id] = hit
        return hit[1]


def _standings(batch: Batch, release_of: ReleaseIds, rules: Mapping[int, ReleaseRule | None],
               facts: DeviceFacts) -> StandingMap:
    out: StandingMap = {}
    for r in batch.reports:
        rid = release_of[(r.model, r.version, r.channel)]
        out[r.id] = None if rid is None else standing_of(r, rules.get(rid), facts)
    return out
