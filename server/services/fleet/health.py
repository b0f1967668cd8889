"""Rollout health from what devices reported (`device_releases`, each device once, its
latest reports) and who was offered the release (the enrolled devices its rule reaches, by
the rule devices apply: server/publish/preview.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.db import models as db
from server.publish import rollouts as ro
from server.publish.preview import MAX_PREVIEW_DEVICES, preview, profile_from_dict
from server.publish.publisher import load_artifact_records


@dataclass(frozen=True)
class Standing:
    """One device on one release, as the guard judges it."""

    verdict: str | None
    event: str | None
    rolled_back: bool
    kl_mean_micro: int | None
    candidate_p99_us: int | None


def rule_of(release: db.Release) -> ro.GuardRule:
    return ro.GuardRule(release.guard_min_devices, release.guard_max_fail_share_ppm,
                        release.guard_max_latency_p99_us)


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


def rollout_health(session: Session, rollout_id: int) -> RolloutHealth:
    t = db.DeviceRelease
    rows = session.execute(select(
        t.verdict, t.event, t.downloaded, t.rolled_back, t.kl_mean_micro, t.kl_max_micro,
        t.active_p50_us, t.candidate_p50_us, t.candidate_p99_us)
        .where(t.release_id == rollout_id)).all()
    failed = sum(1 for r in rows if r.verdict == "failed" or r.event == "failed")
    kl = [r.kl_mean_micro for r in rows if r.kl_mean_micro is not None]
    kl_max = [r.kl_max_micro for r in rows if r.kl_max_micro is not None]
    release = session.get(db.Release, rollout_id)
    assert release is not None
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
    )


def standings(session: Session, rollout_id: int) -> list[Standing]:
    t = db.DeviceRelease
    return [Standing(*r) for r in session.execute(
        select(t.verdict, t.event, t.rolled_back, t.kl_mean_micro, t.candidate_p99_us)
        .where(t.release_id == rollout_id))]
