"""Rollout health from what devices reported (`device_releases`, each device once, its
latest counted reports) and who was offered the release (the enrolled devices its rule
reaches, by the rule devices apply: server/rollouts/preview.py).

Only votes that stand count (docs/shadow.md "What a device can influence"): a revoked
device's standing is left out — its past reports too — and so is every standing older than
the release's `evidence_since` (an operator resumed it after a halt). Reports that did not
count (server/services/fleet/standing.py) are shown apart: `not_offered`, `forged`,
`unattested`, each the number of devices that sent such reports."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from server.db import models as db
from server.publish.publisher import load_artifact_records
from server.rollouts import service as ro
from server.rollouts.preview import MAX_PREVIEW_DEVICES, preview, profile_from_dict


@dataclass(frozen=True)
class Standing:
    """One device on one release, as the guard judges it."""

    verdict: str | None
    event: str | None
    rolled_back: bool
    kl_mean_micro: int | None
    candidate_p99_us: int | None
    samples: int | None = None
    passed_at: datetime | None = None  # server time of its first counted pass


def rule_of(release: db.Release) -> ro.GuardRule:
    return ro.GuardRule(release.guard_min_devices, release.guard_max_fail_share_ppm,
                        release.guard_max_latency_p99_us,
                        promote_min_passed=release.promote_min_passed,
                        promote_min_spread_s=release.promote_min_spread_s or 0)


def thresholds_of(release: db.Release) -> tuple[int, int, int] | None:
    """(max_kl_micro, max_latency_p99_us, min_samples) of a shadow release, else None."""
    if release.shadow_max_kl_micro is None:
        return None
    return (release.shadow_max_kl_micro, release.shadow_max_latency_p99_us or 0,
            release.shadow_min_samples or 0)


@dataclass(frozen=True)
class RolloutHealth:
    offered: int
    downloaded: int
    shadow: int
    passed: int
    failed: int
    active: int
    rolled_back: int
    kl_micro: dict[str, int | None]
    latency_p99_us: dict[str, int | None]
    guard: ro.GuardRule
    auto_promote: bool
    # Devices whose reports were stored but not counted, by standing; and devices whose
    # counted votes were removed by their revocation.
    not_counted: dict[str, int] = dataclasses.field(default_factory=dict)
    revoked: int = 0


def percentile(values: Sequence[int], q: float) -> int | None:
    """Nearest-rank percentile (q in 0..1) of `values`; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-int(q * 1_000_000) * len(ordered) // 1_000_000))  # ceil(q * n)
    return ordered[min(rank, len(ordered)) - 1]


def offered(session: Session, rollout_id: int) -> int:
    """Enrolled, unrevoked devices the rollout's rule reaches (newest seen first, at most
    MAX_PREVIEW_DEVICES)."""
    view = ro.get_rollout(session, rollout_id)
    release = session.get(db.Release, rollout_id)
    assert release is not None
    if release.state is db.ReleaseState.halted:
        return 0
    record = dataclasses.replace(view.record,
                                 artifacts=load_artifact_records(session, release.version_id, ""))
    rows = session.execute(select(db.Device.id, db.Device.profile)
                           .where(db.Device.public_key.is_not(None),
                                  db.Device.revoked_at.is_(None))
                           .order_by(db.Device.last_seen_at.desc())
                           .limit(MAX_PREVIEW_DEVICES)).all()
    return len(preview(record, [profile_from_dict(i, p or {}) for i, p in rows]).included)


def _counted(release: db.Release, *columns: Any) -> Any:
    """SELECT `columns` of the release's standings that count: unrevoked devices, not older
    than the release's evidence_since."""
    t = db.DeviceRelease
    stmt = (select(*columns).join(db.Device, db.Device.id == t.device_id)
            .where(t.release_id == release.id, db.Device.revoked_at.is_(None)))
    if release.evidence_since is not None:
        stmt = stmt.where(t.updated_at >= release.evidence_since)
    return stmt


def not_counted(session: Session, release: db.Release) -> dict[str, int]:
    """Devices that sent reports about the release that did not count, per standing."""
    e = db.TelemetryEvent
    stmt = (select(e.standing, func.count(func.distinct(e.device_id)))
            .where(e.release_id == release.id, e.standing.is_not(None),
                   e.standing != "counted").group_by(e.standing))
    if release.evidence_since is not None:
        stmt = stmt.where(e.received_at >= release.evidence_since)
    counts = {name: 0 for name in ("not_offered", "forged", "unattested")}
    counts.update({str(name): int(n) for name, n in session.execute(stmt)})
    return counts


def rollout_health(session: Session, rollout_id: int) -> RolloutHealth:
    """RolloutNotFoundError for an unknown id."""
    ro.get_rollout(session, rollout_id)  # RolloutNotFoundError
    t = db.DeviceRelease
    release = session.get(db.Release, rollout_id)
    assert release is not None
    rows = session.execute(_counted(
        release, t.verdict, t.event, t.downloaded, t.rolled_back, t.kl_mean_micro,
        t.kl_max_micro, t.active_p50_us, t.candidate_p50_us, t.candidate_p99_us)).all()
    revoked = session.scalar(
        select(func.count()).select_from(t).join(db.Device, db.Device.id == t.device_id)
        .where(t.release_id == rollout_id, db.Device.revoked_at.is_not(None))) or 0
    failed = sum(1 for r in rows if r.verdict == "failed" or r.event == "failed")
    kl = [r.kl_mean_micro for r in rows if r.kl_mean_micro is not None]
    kl_max = [r.kl_max_micro for r in rows if r.kl_max_micro is not None]
    return RolloutHealth(
        offered=offered(session, rollout_id),
        downloaded=sum(1 for r in rows if r.downloaded),
        shadow=sum(1 for r in rows if r.verdict == "pending" and r.event != "failed"),
        passed=sum(1 for r in rows if r.verdict == "passed" and r.event != "failed"),
        failed=failed,
        active=sum(1 for r in rows if r.event == "activated"),
        rolled_back=sum(1 for r in rows if r.rolled_back),
        kl_micro={"p50": percentile(kl, 0.5), "p99": percentile(kl, 0.99),
                  "max": max(kl_max) if kl_max else None},
        latency_p99_us={
            "active_p50": percentile([r.active_p50_us for r in rows
                                      if r.active_p50_us is not None], 0.5),
            "candidate_p50": percentile([r.candidate_p50_us for r in rows
                                         if r.candidate_p50_us is not None], 0.5),
            "candidate_p99": percentile([r.candidate_p99_us for r in rows
                                         if r.candidate_p99_us is not None], 0.99)},
        guard=rule_of(release), auto_promote=release.auto_promote,
        not_counted=not_counted(session, release), revoked=int(revoked),
    )


def standings(session: Session, rollout_id: int) -> list[Standing]:
    """The votes the guard counts (see the module docstring)."""
    t = db.DeviceRelease
    release = session.get(db.Release, rollout_id)
    if release is None:
        return []
    return [Standing(*r) for r in session.execute(_counted(
        release, t.verdict, t.event, t.rolled_back, t.kl_mean_micro, t.candidate_p99_us,
        t.samples, t.passed_at))]
