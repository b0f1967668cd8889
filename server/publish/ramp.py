"""Stepping a rollout along its ramp schedule: which rollouts have a step due, and the step
itself — the next share, audited as `rollout.ramp` by `system` and published as a new signed
manifest with a higher serial, in one transaction.

Whether a rollout is healthy enough to take its step is the fleet's call
(server/services/fleet/ramp.py); this module only moves the share, and only when the step is
still due when it holds the channel lock. Several API replicas may try the same step at once:
the channel row lock (SELECT … FOR UPDATE on PostgreSQL) queues them, and the share moves by
a conditional UPDATE (`WHERE ramp_step = k AND ramp_next_at <= now AND state = 'active' AND
mode = 'active'`), so the second replica changes no row and publishes nothing — on SQLite,
which has no row locks, too. A pause, a halt or a manual ramp committed first makes the
UPDATE miss in the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from server import crashpoints
from server.db import audit
from server.db import models as db
from server.db.types import utcnow
from server.publish.publisher import Audited, Publisher, publish_change
from server.publish.rollouts import get_rollout

ACTOR = "system"


@dataclass(frozen=True)
class RampStep:
    """A step taken: the rollout now offers `share_ppm` (step `step` of `steps`, 1-based)."""

    rollout_id: int
    channel: str
    step: int
    steps: int
    share_ppm: int
    serial: int
    reason: str


def due_ramps(session: Session, now: int, only: set[int] | None = None) -> list[int]:
    """Active, promoted (not shadow) rollouts whose next step is due at `now`, by id."""
    query = select(db.Release.id).where(
        db.Release.ramp_next_at.is_not(None), db.Release.ramp_next_at <= now,
        db.Release.state == db.ReleaseState.active, db.Release.mode == db.RolloutMode.active,
    ).order_by(db.Release.id)
    if only is not None:
        query = query.where(db.Release.id.in_(sorted(only)))
    return list(session.scalars(query))


def advance_ramp(factory: sessionmaker[Session], pub: Publisher, rollout_id: int, *,
                 health: str) -> RampStep | None:
    """Take the rollout's next step if it is still due; None when it was not (taken by
    another replica, paused, halted, ramped by hand, not due yet). `health` is why the fleet
    judged it healthy, recorded in the audit event's reason."""
    with factory() as session:
        view = get_rollout(session, rollout_id)  # RolloutNotFoundError
    taken: list[RampStep] = []

    def change(session: Session, ch: db.Channel) -> Audited:
        taken.clear()  # a retried attempt starts over
        now = pub.clock()
        release = session.get(db.Release, rollout_id)
        assert release is not None  # releases are never deleted
        k, steps = release.ramp_step, list(release.ramp_steps_ppm or [])
        if k is None or release.ramp_interval_s is None or k + 1 >= len(steps):
            return Audited("rollout.ramp", str(rollout_id), {}, publish=False)
        share = steps[k + 1]
        next_at = now + release.ramp_interval_s if k + 2 < len(steps) else None
        moved = session.execute(
            update(db.Release).where(
                db.Release.id == rollout_id, db.Release.ramp_step == k,
                db.Release.ramp_next_at <= now, db.Release.state == db.ReleaseState.active,
                db.Release.mode == db.RolloutMode.active,
            ).values(share_ppm=share, ramp_step=k + 1, ramp_next_at=next_at,
                     updated_at=utcnow())
            .execution_options(synchronize_session="fetch"))
        if moved.rowcount != 1:  # type: ignore[attr-defined]  # CursorResult
            return Audited("rollout.ramp", str(rollout_id), {}, publish=False)
        reason = f"ramp schedule step {k + 2}/{len(steps)}: {health}"
        audit.record(session, ACTOR, "rollout.ramp",
                     f"{ch.name}/{view.record.model}/{view.record.version}",
                     rollout_id=rollout_id, share_ppm=share, reason=reason, step=k + 2,
                     steps=len(steps))
        taken.append(RampStep(rollout_id, ch.name, k + 2, len(steps), share, 0, reason))
        crashpoints.reached("ramp.moved")
        return Audited("rollout.ramp", str(rollout_id), {}, rollout_id=rollout_id)

    _, published = publish_change(factory, pub, view.channel, change)
    if published is None or not taken:
        return None
    step = taken[0]
    return RampStep(step.rollout_id, step.channel, step.step, step.steps, step.share_ppm,
                    published.serial, step.reason)

